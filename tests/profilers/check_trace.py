"""Reads a TorchProfiler trace as a Chrome-trace reader does and checks what fulgur promises of it.

  check_trace.py <trace.json> <range>=<count>... [--kernels]

The file must be a Chrome Trace Event Format document (what Perfetto and chrome://tracing load): a
JSON object whose "traceEvents" is a list of events with "ph", "name", "pid", "tid", numeric "ts", and
"dur" for complete ("X") events. Each <range>=<count> says how many complete events of that name the
trace holds; every LibTorch operator the trace holds must lie inside one of fulgur's ranges on its
thread (the ranges are recorded around the work, as record_function does). --kernels: the trace must
also hold GPU kernels ("kernel" events, from CUPTI). Prints a summary; exits non-zero with the reason on
any failure.
"""
import json
import sys


def main():
    kernels = "--kernels" in sys.argv
    path = sys.argv[1]
    expected = dict(arg.rsplit("=", 1) for arg in sys.argv[2:] if arg != "--kernels")
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else None
    if not isinstance(events, list) or not events:
        sys.exit(f"{path}: no traceEvents list")
    complete = []
    for e in events:
        for key in ("ph", "name", "pid", "tid"):
            if key not in e:
                sys.exit(f"{path}: an event without {key!r}: {e}")
        if e["ph"] == "X":
            if not isinstance(e.get("ts"), (int, float)) or not isinstance(e.get("dur"), (int, float)):
                sys.exit(f"{path}: a complete event without numeric ts/dur: {e}")
            complete.append(e)
    counts = {}
    for e in complete:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    for name, count in expected.items():
        if counts.get(name, 0) != int(count):
            sys.exit(f"{path}: {counts.get(name, 0)} '{name}' ranges, expected {count}")
    fulgur = [e for e in complete if e.get("cat") == "user_annotation"]
    ops = [e for e in complete if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]
    if not fulgur or not ops:
        sys.exit(f"{path}: {len(fulgur)} user annotations, {len(ops)} aten operators")
    if kernels and not any(e.get("cat") == "kernel" for e in complete):
        sys.exit(f"{path}: no GPU kernel events")
    outside = [op for op in ops if not any(r["tid"] == op["tid"] and r["ts"] <= op["ts"] and
                                           op["ts"] + op["dur"] <= r["ts"] + r["dur"] + 1 for r in fulgur)]
    if outside:
        sys.exit(f"{path}: {len(outside)} operators outside every fulgur range, e.g. {outside[0]['name']}")
    print(f"{path}: {len(events)} events, {len(fulgur)} fulgur ranges, {len(ops)} aten operators: ok")


if __name__ == "__main__":
    main()
