"""Compares the scalars TensorBoard shows for two log directories.

    python compare_tensorboard.py EXPECTED_DIR ACTUAL_DIR

Reads each with TensorBoard's own EventAccumulator (which applies the purge markers a resumed run
writes) and checks that every scalar tag has the same (step, value) list in both. Exits 1 on a
difference, printing it.
"""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(path):
    events = EventAccumulator(path)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def main():
    expected, actual = scalars(sys.argv[1]), scalars(sys.argv[2])
    problems = []
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
