"""Compares the scalars TensorBoard shows for two log directories.

    python compare_tensorboard.py EXPECTED_DIR ACTUAL_DIR [--purge-at STEP]

Reads each with TensorBoard's own EventAccumulator (which applies the purge markers a resumed run
writes) and checks that every scalar tag has the same (step, value) list in both; with --purge-at,
also that ACTUAL_DIR's event files hold SummaryWriter's purge marker (SessionLog START) at STEP.
Exits 1 on a difference, printing it.
"""
import argparse
import pathlib
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2


def scalars(path):
    events = EventAccumulator(path)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def purge_markers(path):
    steps = []
    for file in sorted(pathlib.Path(path).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(file)).Load():
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                steps.append(event.step)
    return steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("expected")
    parser.add_argument("actual")
    parser.add_argument("--purge-at", type=int)
    args = parser.parse_args()
    expected, actual = scalars(args.expected), scalars(args.actual)
    problems = []
    if args.purge_at is not None and purge_markers(args.actual) != [args.purge_at]:
        problems.append(f"purge markers at steps {purge_markers(args.actual)}, expected one at {args.purge_at}")
    if sorted(expected) != sorted(actual):
        problems.append(f"tags differ: {sorted(expected)} vs {sorted(actual)}")
    for tag in sorted(set(expected) & set(actual)):
        if expected[tag] != actual[tag]:
            problems.append(f"{tag}: expected {expected[tag]}, got {actual[tag]}")
    for p in problems:
        print(p)
    print(f"{len(expected)} tags, {sum(len(v) for v in expected.values())} points compared")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
