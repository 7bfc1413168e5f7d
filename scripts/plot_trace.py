"""Draws a TorchProfiler trace (Chrome trace-event JSON) as a timeline PNG, for the docs.

  plot_trace.py <trace.pt.trace.json> <out.png> [--title TEXT] [--depth N]

One row per nesting depth on the busiest thread (fulgur's ranges on top, the operators they call
below), each complete event a bar labelled when wide enough, as a trace viewer lays them out. This is
a picture of the file, not Perfetto's UI (which cannot be fetched on a machine without the internet).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--title", default="")
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    threads = {}
    for e in events:
        threads.setdefault((e["pid"], e["tid"]), []).append(e)
    busiest = max(threads.values(), key=lambda es: sum(e["dur"] for e in es if e.get("cat") == "cpu_op"))
    busiest.sort(key=lambda e: (e["ts"], -e["dur"]))
    start = min(e["ts"] for e in busiest)
    rows, stack = [], []
    for e in busiest:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        depth = len(stack)
        stack.append(e)
        if depth < args.depth:
            rows.append((depth, e))
    fig, ax = plt.subplots(figsize=(14, 0.6 * args.depth + 1.2))
    colors = {"user_annotation": "#4c72b0", "cpu_op": "#dd8452"}
    span = max(e["ts"] + e["dur"] for _, e in rows) - start
    for depth, e in rows:
        x, w = (e["ts"] - start) / 1e3, e["dur"] / 1e3
        ax.barh(-depth, w, left=x, height=0.8, color=colors.get(e.get("cat"), "#8c8c8c"), edgecolor="white", lw=0.3)
        if w > span / 1e3 * 0.06:
            ax.text(x + w / 2, -depth, e["name"][:40], ha="center", va="center", fontsize=6, color="white", clip_on=True)
    ax.set_yticks([-d for d in range(args.depth)], [f"depth {d}" for d in range(args.depth)], fontsize=7)
    ax.set_xlabel("ms since the first recorded event")
    ax.set_title(args.title or args.trace, fontsize=9)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=["fulgur actions (user_annotation)", "LibTorch operators (cpu_op)"], fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)


if __name__ == "__main__":
    main()
