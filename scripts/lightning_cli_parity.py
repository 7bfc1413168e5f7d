#!/usr/bin/env python3
"""One YAML config through LightningCLI and through a fulgur::cli program: the resolved settings agree.

    lightning_cli_parity.py DIGITS_CLASSIFIER CONFIG.yaml

LightningCLI (the venv's lightning + jsonargparse) parses CONFIG for a Python twin of the digits
example's module and data module and builds its Trainer; the fulgur program prints its resolved
config for the same file (`fit --config CONFIG --print_config`). Compared: the Trainer settings
(max_epochs, precision, accumulate_grad_batches, gradient_clip_val, val_check_interval, ...), every
callback's class and init_args as LightningCLI resolved them (defaults included), the model and data
sections, and the seed. Exits 1 naming each difference.
"""
import subprocess
import sys
import warnings

import yaml

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from lightning.fabric.connector import _convert_precision_to_unified_args  # noqa: E402
from lightning.pytorch import LightningDataModule, LightningModule  # noqa: E402
from lightning.pytorch.cli import LightningCLI  # noqa: E402


class DigitsNet(LightningModule):
    """The digits example's module, by its constructor: the same hyper-parameters and defaults."""

    def __init__(self, hidden: int = 128, lr: float = 2e-3, plateau_factor: float = 0.3, plateau_patience: int = 3):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(64, 10)


class DigitsData(LightningDataModule):
    def __init__(self, path: str = "data/digits.csv", batch_size: int = 64, held_out: float = 0.2, split_seed: int = 0):
        super().__init__()
        self.save_hyperparameters()


def lightning_side(config_path):
    cli = LightningCLI(DigitsNet, DigitsData, run=False, args=["--config", config_path],
                       save_config_callback=None, seed_everything_default=True)
    t = cli.trainer
    trainer = {
        "max_epochs": t.max_epochs,
        "min_epochs": t.min_epochs,
        "max_steps": t.max_steps,
        "precision": str(t.precision),
        "accumulate_grad_batches": t.accumulate_grad_batches,
        "gradient_clip_val": t.gradient_clip_val,
        "gradient_clip_algorithm": t.gradient_clip_algorithm,
        "val_check_interval": t.val_check_interval,
        "check_val_every_n_epoch": t.check_val_every_n_epoch,
        "limit_train_batches": t.limit_train_batches,
        "log_every_n_steps": t.log_every_n_steps,
    }
    callbacks = []
    for spec in cli.config["trainer"]["callbacks"] or []:
        callbacks.append((spec["class_path"].rsplit(".", 1)[-1], dict(spec["init_args"])))
    as_dict = lambda ns: {k: v for k, v in dict(ns).items()}  # noqa: E731
    return {"trainer": trainer, "callbacks": callbacks, "model": as_dict(cli.config["model"]),
            "data": as_dict(cli.config["data"]), "seed_everything": cli.config["seed_everything"]}


def fulgur_side(program, config_path):
    text = subprocess.run([program, "fit", "--config", config_path, "--print_config"], check=True,
                          capture_output=True, text=True).stdout
    resolved = yaml.safe_load(text)
    t = resolved["trainer"]
    trainer = {k: t[k] for k in ("max_epochs", "min_epochs", "max_steps", "accumulate_grad_batches",
                                 "gradient_clip_val", "gradient_clip_algorithm", "val_check_interval",
                                 "check_val_every_n_epoch", "limit_train_batches", "log_every_n_steps")}
    trainer["precision"] = str(_convert_precision_to_unified_args(t["precision"]))  # Lightning's own aliases
    callbacks = []
    for spec in t["callbacks"]:
        if isinstance(spec, str):
            spec = {"class_path": spec, "init_args": {}}
        callbacks.append((spec["class_path"].rsplit(".", 1)[-1], spec["init_args"]))
    return {"trainer": trainer, "callbacks": callbacks, "model": resolved["model"], "data": resolved["data"],
            "seed_everything": resolved["seed_everything"]}


# Where Lightning keeps None for a default it then reads as a value, the value (fulgur prints the value).
LIGHTNING_NONE_MEANS = {
    "trainer.min_epochs": 0,                       # the fit loop: no minimum
    "trainer.gradient_clip_algorithm": "norm",     # Trainer.clip_gradients: `or GradClipAlgorithmType.NORM`
    "ModelCheckpoint.every_n_train_steps": 0,      # ModelCheckpoint.__init_triggers: None -> 0
}


def same(a, b, key=""):
    if a is None and key in LIGHTNING_NONE_MEANS:
        a = LIGHTNING_NONE_MEANS[key]
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and float(a) == float(b)
    if a in ("", None) and b in ("", None):  # fulgur's empty string is Lightning's None (dirpath, monitor)
        return True
    return a == b


def main():
    program, config_path = sys.argv[1], sys.argv[2]
    lightning, fulgur = lightning_side(config_path), fulgur_side(program, config_path)
    problems, compared = [], 0
    for key, value in lightning["trainer"].items():
        compared += 1
        if not same(value, fulgur["trainer"][key], f"trainer.{key}"):
            problems.append(f"trainer.{key}: Lightning {value!r}, fulgur {fulgur['trainer'][key]!r}")
    if [c for c, _ in lightning["callbacks"]] != [c for c, _ in fulgur["callbacks"]]:
        problems.append(f"callbacks: Lightning {[c for c, _ in lightning['callbacks']]}, "
                        f"fulgur {[c for c, _ in fulgur['callbacks']]}")
    else:
        for (name, lightning_args), (_, fulgur_args) in zip(lightning["callbacks"], fulgur["callbacks"]):
            for key, value in fulgur_args.items():
                compared += 1
                if key not in lightning_args:
                    problems.append(f"{name}.{key}: fulgur has it, Lightning's {name} does not")
                elif not same(lightning_args[key], value, f"{name}.{key}"):
                    problems.append(f"{name}.{key}: Lightning {lightning_args[key]!r}, fulgur {value!r}")
    for section in ("model", "data"):
        for key in sorted(set(lightning[section]) | set(fulgur[section])):
            compared += 1
            if not same(lightning[section].get(key), fulgur[section].get(key)):
                problems.append(f"{section}.{key}: Lightning {lightning[section].get(key)!r}, "
                                f"fulgur {fulgur[section].get(key)!r}")
    compared += 1
    if lightning["seed_everything"] != fulgur["seed_everything"]:
        problems.append(f"seed_everything: Lightning {lightning['seed_everything']!r}, fulgur {fulgur['seed_everything']!r}")
    for p in problems:
        print("MISMATCH", p)
    print(f"lightning_cli_parity: {compared} settings compared, {len(problems)} differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
