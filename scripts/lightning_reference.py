"""Lightning's own behaviour, recorded at test time for the C++ tests to compare with.

    python scripts/lightning_reference.py OUT_DIR

Writes, for each scenario below, `hooks_<scenario>.txt` (the hooks Lightning called on the module,
in order, one per line; setup/teardown as `setup:fit`) and `metrics_<scenario>.txt` (lines
`<view> <epoch|final> <name> <value>` for callback, logged and progress-bar metrics).

Which hooks count: every hook fulgur claims, read from include/fulgur/hooks.hpp (one source of
truth), plus configure_optimizers. Lightning calls on_sanity_check_start/end and on_exception on
callbacks only; a callback records those, and fulgur calls them on the module too.
The scenarios' numbers are repeated in tests/unit/lightning_parity_tests.cpp.
"""
import logging
import os
import pathlib
import re
import sys
import warnings

os.environ.setdefault("PL_DISABLE_FORK", "1")
warnings.filterwarnings("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

import torch  # noqa: E402
logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.ERROR)
import lightning.pytorch as pl  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALLBACK_ONLY = {"on_sanity_check_start", "on_sanity_check_end", "on_exception"}


def fulgur_hooks():
    text = (ROOT / "include/fulgur/hooks.hpp").read_text()
    names = re.findall(r"^FULGUR_DETAIL_DEFINE_(?:CALLBACK_)?HOOK\((\w+),", text, re.M)
    return set(names) | {"configure_optimizers"}


HOOKS = fulgur_hooks()


def fulgur_callback_hooks():
    text = (ROOT / "include/fulgur/concepts/callback.hpp").read_text()
    block = text[text.index("#define FULGUR_CALLBACK_HOOK_NAMES"):text.index("namespace fulgur")]
    return set(re.findall(r"X\((\w+)\)", block))


CALLBACK_HOOKS = fulgur_callback_hooks()


class SpyCallback(pl.Callback):
    """Records every callback hook fulgur claims as `cb:<hook>` (`cb:setup:fit`)."""

    def __init__(self, calls):
        self.calls = calls


def _spy_callback_hook(name):
    def hook(self, trainer, module, *args, **kwargs):
        stage = ""
        if name in ("setup", "teardown"):
            value = args[0] if args else kwargs["stage"]
            stage = ":" + str(getattr(value, "value", value))
        self.calls.append("cb:" + name + stage)
    return hook


for _name in CALLBACK_HOOKS:
    setattr(SpyCallback, _name, _spy_callback_hook(_name))


def data(n, features=4, batch_size=4):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=generator)
    y = torch.randint(0, 2, (n,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


class Recorder(pl.Callback):
    def __init__(self, calls):
        self.calls = calls

    def on_sanity_check_start(self, trainer, module):
        self.calls.append("on_sanity_check_start")

    def on_sanity_check_end(self, trainer, module):
        self.calls.append("on_sanity_check_end")


def spy_class(calls, stop_at=None):
    """A module whose every fulgur hook records its name, then does what Lightning's default does."""

    class Spy(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

        test_step = validation_step

        def predict_step(self, batch, batch_idx):
            return self.fc(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_batch_start(self, batch, batch_idx):
            if stop_at is not None and (self.current_epoch, batch_idx) == stop_at:
                return -1
            return None

    def wrap(name):
        original = getattr(Spy, name)

        def hook(self, *args, **kwargs):
            stage = ""
            if name in ("setup", "teardown"):
                value = args[0] if args else kwargs["stage"]
                stage = ":" + str(getattr(value, "value", value))
            calls.append(name + stage)
            return original(self, *args, **kwargs)

        return hook

    for name in HOOKS - CALLBACK_ONLY:
        if hasattr(pl.LightningModule, name) or name in Spy.__dict__:
            setattr(Spy, name, wrap(name))
    return Spy


def trainer(calls, **kwargs):
    options = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False,
                   callbacks=[Recorder(calls)])
    options.update(kwargs)
    return pl.Trainer(**options)


def hooks_scenarios():
    """name -> (calls) for the hook-order scenarios."""
    out = {}

    calls = []  # validation, accumulation, two epochs, the sanity check
    trainer(calls, max_epochs=2, accumulate_grad_batches=2, limit_val_batches=2).fit(
        spy_class(calls)(), data(12), data(12))
    out["fit"] = calls

    calls = []  # validation every 2 batches of 5, no sanity check, then max_steps mid-epoch
    trainer(calls, max_steps=7, val_check_interval=2, num_sanity_val_steps=0).fit(
        spy_class(calls)(), data(20), data(8))
    out["fit_interval"] = calls

    calls = []  # on_train_batch_start returns -1 at epoch 0, batch 1
    trainer(calls, max_epochs=2, num_sanity_val_steps=0).fit(spy_class(calls, stop_at=(0, 1))(), data(12), data(8))
    out["fit_batch_start_stop"] = calls

    calls = []  # nothing to train: the sanity check runs, on_train_start/end do not
    trainer(calls, max_epochs=0).fit(spy_class(calls)(), data(12), data(8))
    out["fit_max_epochs_0"] = calls

    calls = []  # callbacks: a spy callback and EarlyStopping beside the spy module; validation,
    # accumulation, and an early stop at epoch 2 (the watched value improves once, then not)
    Watching = spy_class(calls)

    class Watched(Watching):
        def validation_step(self, batch, batch_idx):
            self.log("watched", [3.0, 2.0, 2.5, 2.6, 2.7][self.current_epoch])
            return super().validation_step(batch, batch_idx)

    pl.Trainer(max_epochs=5, accumulate_grad_batches=2, limit_val_batches=2, enable_progress_bar=False,
               enable_model_summary=False, logger=False, enable_checkpointing=False,
               callbacks=[SpyCallback(calls), Recorder(calls), pl.callbacks.EarlyStopping("watched", patience=1)]).fit(
        Watched(), data(12), data(12))
    out["callbacks"] = calls

    for stage in ("validate", "test", "predict"):
        calls = []
        getattr(trainer(calls), stage)(spy_class(calls)(), data(8))
        out[stage] = calls
    return out


class Logging(pl.LightningModule):
    """Logs values that depend only on where the loop is, in every way log() can be asked to."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        e = float(self.current_epoch)
        self.log("a", batch_idx + 10 * e)
        self.log("b", batch_idx + e, on_step=True, on_epoch=True, prog_bar=True)
        self.log("c", batch_idx + 1.0, on_step=False, on_epoch=True, reduce_fx="sum")
        self.log("m", batch_idx * 2.0 - e, on_step=False, on_epoch=True, reduce_fx="max")
        self.log("n", batch_idx * 2.0 + e, on_step=False, on_epoch=True, reduce_fx="min")
        self.log("w", batch_idx * 3.0 + e, on_epoch=True)
        return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("v", batch_idx * 2.0 + self.current_epoch)
        self.log("vs", batch_idx + 0.5, on_step=True, prog_bar=True)
        self.log("vm", batch_idx * 1.0, reduce_fx="max", logger=False)

    def on_train_epoch_end(self):
        self.log("e", self.current_epoch * 3.0)

    def on_validation_epoch_end(self):
        self.log("ve", 1.5 + self.current_epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class MetricsRecorder(pl.Callback):
    def __init__(self, lines):
        self.lines = lines

    def record(self, trainer, when):
        for view, metrics in (("callback", trainer.callback_metrics), ("logged", trainer.logged_metrics),
                              ("progress_bar", trainer.progress_bar_metrics)):
            for name, value in sorted(metrics.items()):
                self.lines.append(f"{view} {when} {name} {float(value)!r}")

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch > 0:
            self.record(trainer, f"epoch{trainer.current_epoch - 1}")

    def on_train_end(self, trainer, module):
        self.record(trainer, "final")

    # The views are live: a batch hook already sees what this batch's step logged.
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.record(trainer, f"train{trainer.current_epoch}.{batch_idx}")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.record(trainer, f"val{trainer.current_epoch}.{batch_idx}")


def metrics_scenarios():
    lines = []  # 10 samples in batches of 4, 4, 2: epoch means are weighted by the batch size
    pl.Trainer(max_epochs=2, enable_progress_bar=False, enable_model_summary=False, logger=False,
               enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1,
               callbacks=[MetricsRecorder(lines)]).fit(Logging(), data(10), data(6))
    return {"logging": lines}


class SharedNames(pl.LightningModule):
    """Training and validation log the same names; test logs its own (the views must follow each)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        self.log("x", 100.0 + batch_idx + 10 * self.current_epoch)
        self.log("dup", 100.0 + batch_idx)
        return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("x", -1.0 - batch_idx)
        self.log("dup", -2.0, on_step=True, on_epoch=False)
        self.log("vacc", 0.5 + batch_idx)

    def test_step(self, batch, batch_idx):
        self.log("tacc", 0.25 * (batch_idx + 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BatchViews(MetricsRecorder):
    """The views at each batch end and evaluation epoch end, as "<stage>:<hook><epoch>.<batch>"."""

    def at(self, trainer, what):
        self.record(trainer, f"{trainer.state.fn.value}:{what}{trainer.current_epoch}")

    def on_train_epoch_start(self, trainer, module):
        pass

    def on_train_end(self, trainer, module):
        pass

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.at(trainer, f"train_batch.{batch_idx}.")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.at(trainer, f"val_batch.{batch_idx}.")

    def on_validation_epoch_end(self, trainer, module):
        self.at(trainer, "val_end.")

    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.at(trainer, f"test_batch.{batch_idx}.")

    def on_test_epoch_end(self, trainer, module):
        self.at(trainer, "test_end.")


def shared_names_scenario():
    lines = []  # 4 training batches, validation after every 2 (2 batches), then validate and test
    trainer = pl.Trainer(max_epochs=2, val_check_interval=2, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1,
                         callbacks=[BatchViews(lines)])
    module = SharedNames()
    trainer.fit(module, data(16), data(8))
    trainer.validate(module, data(8), verbose=False)
    trainer.test(module, data(8), verbose=False)
    return lines


def csv_scenario(out):
    """Lightning's CSVLogger on the Logging module: metrics_logging.csv."""
    save_dir = out / "csv"
    pl.Trainer(max_epochs=2, enable_progress_bar=False, enable_model_summary=False,
               logger=pl.loggers.CSVLogger(str(save_dir)), enable_checkpointing=False, num_sanity_val_steps=0,
               log_every_n_steps=1).fit(Logging(), data(10), data(6))
    (out / "metrics_logging.csv").write_text((save_dir / "lightning_logs/version_0/metrics.csv").read_text())


class Summarized(pl.LightningModule):
    """The module of the ModelSummary test (tests/unit/callbacks_tests.cpp builds the same)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(32, 10)
        self.bn = torch.nn.BatchNorm1d(10)
        self.big = torch.nn.Linear(1000, 1200)
        self.bn.eval()
        self.fc2.weight.requires_grad_(False)


def summary_scenario(out):
    from lightning.pytorch.utilities.model_summary import ModelSummary
    (out / "model_summary.txt").write_text(str(ModelSummary(Summarized(), max_depth=1)) + "\n")


class SeveralLoaders(pl.LightningModule):
    """Two evaluation loaders: what each step logs is suffixed "/dataloader_idx_N"; the epoch end's not.
    The values depend on the batches only (x.sum() * (dataloader_idx + 1)), so fulgur can match them."""

    def __init__(self, calls):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.calls = calls

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

    def _evaluate(self, stage, batch, batch_idx, dataloader_idx):
        self.calls.append(f"{stage}_step {batch_idx} {dataloader_idx}")
        self.log("err", batch[0].sum() * (dataloader_idx + 1))

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self._evaluate("validation", batch, batch_idx, dataloader_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self._evaluate("test", batch, batch_idx, dataloader_idx)

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self.calls.append(f"on_validation_batch_start {batch_idx} {dataloader_idx}")

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.calls.append(f"on_validation_batch_end {batch_idx} {dataloader_idx}")

    def on_validation_epoch_start(self):
        self.calls.append("on_validation_epoch_start")

    def on_validation_epoch_end(self):
        self.calls.append("on_validation_epoch_end")
        self.log("summary", 1.5)

    def on_test_epoch_end(self):
        self.log("summary", 2.5)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def ramp(first, n, batch_size):
    """Samples first, first + 1, ... as 4 features each (x[i] = (first + i) / 10 * [1, 2, 3, 4])."""
    x = torch.arange(first, first + n, dtype=torch.float32).unsqueeze(1) / 10 * torch.tensor([1.0, 2, 3, 4])
    return DataLoader(TensorDataset(x, torch.zeros(n, dtype=torch.long)), batch_size=batch_size)


def several_loaders_scenario(out):
    """validate and test with two loaders (6 samples in batches of 4, 2; 3 in one batch), and fit with
    them: `calls_several_loaders.txt` (the module's evaluation calls) and `results_several_loaders.txt`
    (lines `<what> <loader> <name> <value>`: each loader's result dict, then fit's callback metrics as
    loader -1)."""
    calls, lines = [], []
    module = SeveralLoaders(calls)
    kwargs = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer = pl.Trainer(max_epochs=1, num_sanity_val_steps=0, **kwargs)
    for what, run in (("validate", trainer.validate), ("test", trainer.test)):
        results = run(module, [ramp(0, 6, 4), ramp(6, 3, 4)], verbose=False)
        for idx, result in enumerate(results):
            lines += [f"{what} {idx} {name} {float(value):.9g}" for name, value in sorted(result.items())]
    calls.append("fit")
    trainer = pl.Trainer(max_epochs=1, num_sanity_val_steps=0, **kwargs)
    trainer.fit(module, ramp(0, 4, 4), [ramp(0, 6, 4), ramp(6, 3, 4)])
    lines += [f"fit -1 {name} {float(value):.9g}" for name, value in sorted(trainer.callback_metrics.items())]
    (out / "calls_several_loaders.txt").write_text("\n".join(calls) + "\n")
    (out / "results_several_loaders.txt").write_text("\n".join(lines) + "\n")


def main(out_dir):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, calls in hooks_scenarios().items():
        kept = [c for c in calls if c.split(":")[0] in HOOKS or (c.startswith("cb:") and c.split(":")[1] in CALLBACK_HOOKS)]
        (out / f"hooks_{name}.txt").write_text("\n".join(kept) + "\n")
    for name, lines in metrics_scenarios().items():
        (out / f"metrics_{name}.txt").write_text("\n".join(lines) + "\n")
    (out / "metrics_shared_names.txt").write_text("\n".join(shared_names_scenario()) + "\n")
    csv_scenario(out)
    summary_scenario(out)
    several_loaders_scenario(out)
    print(f"lightning {pl.__version__}: reference written to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
