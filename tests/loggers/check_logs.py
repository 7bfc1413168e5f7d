"""Reads a fulgur log directory back with the tools a Python user has, and checks it.

    python check_logs.py VERSION_DIR --steps N --epochs E

metrics.csv through the csv module; the event file through TensorBoard's own EventAccumulator (scalars
and the hparams plugin); hparams.yaml through PyYAML. Expects the run of tests/unit/callbacks_tests.cpp
("CSV and TensorBoard logs read back ..."): train_loss logged on step and epoch, score and val_loss per
validation, hyper-parameters lr/hidden/optimizer. Prints every problem; exits 1 if there is one.
"""
import argparse
import csv
import math
import pathlib
import sys

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

problems = []


def expect(condition, text):
    if not condition:
        problems.append(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    args = parser.parse_args()
    log_dir = pathlib.Path(args.log_dir)

    with open(log_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    step_rows = [r for r in rows if r.get("train_loss_step")]
    expect([int(r["step"]) for r in step_rows] == list(range(args.steps)),
           f"train_loss_step rows at steps {[r['step'] for r in step_rows]}, expected 0..{args.steps - 1}")
    epoch_rows = [r for r in rows if r.get("train_loss_epoch")]
    expect([int(r["epoch"]) for r in epoch_rows] == list(range(args.epochs)),
           f"train_loss_epoch rows for epochs {[r['epoch'] for r in epoch_rows]}")
    val_rows = [r for r in rows if r.get("val_loss")]
    expect(len(val_rows) == args.epochs and all(r.get("score") for r in val_rows),
           f"{len(val_rows)} validation rows with val_loss and score, expected {args.epochs}")

    events = EventAccumulator(str(log_dir))
    events.Reload()
    scalars = events.Tags()["scalars"]
    for tag in ("train_loss_step", "train_loss_epoch", "val_loss", "score", "epoch", "hp_metric"):
        expect(tag in scalars, f"no scalar {tag} in the event file (has {scalars})")
    if "train_loss_step" in scalars:
        tensorboard_steps = {e.step: e.value for e in events.Scalars("train_loss_step")}
        for r in step_rows:
            value = tensorboard_steps.get(int(r["step"]))
            expect(value is not None and math.isclose(value, float(r["train_loss_step"]), rel_tol=1e-6),
                   f"step {r['step']}: TensorBoard has {value}, the CSV {r['train_loss_step']}")
    if "hp_metric" in scalars:
        expect([(e.step, e.value) for e in events.Scalars("hp_metric")] == [(0, -1.0)], "hp_metric is not -1 at step 0")

    content = events.PluginTagToContent("hparams")
    expect("_hparams_/session_start_info" in content, f"no hparams session start info (has {list(content)})")
    if "_hparams_/session_start_info" in content:
        data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hparams = data.session_start_info.hparams
        expect(math.isclose(hparams["lr"].number_value, 0.1) and hparams["hidden"].number_value == 2
               and hparams["optimizer"].string_value == "sgd", f"hparams in the event file: {dict(hparams)}")

    with open(log_dir / "hparams.yaml") as file:
        saved = yaml.safe_load(file)
    expect(saved == {"lr": 0.1, "hidden": 2, "optimizer": "sgd"}, f"hparams.yaml holds {saved}")

    for problem in problems:
        print("problem:", problem)
    print(f"{len(rows)} CSV rows, {len(scalars)} scalar tags: {'ok' if not problems else 'FAILED'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
