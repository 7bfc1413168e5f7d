"""Lightning's side of fulgur's profiler tests (tests/unit/profiler_tests.cpp), made at test time.

  lightning_profile.py report <durations.tsv> <total_seconds> <stage> <extended 0|1>
      prints Lightning's SimpleProfiler.summary() for the timings in the file (lines "<ns>\t<action>",
      one per call), with the clock standing at <total_seconds> since the profiler was made.
  lightning_profile.py fit
      runs the fit tests/unit/profiler_tests.cpp runs (module Net, EarlyStopping on val_loss, 2
      epochs of 4 batches, sanity check of 2) under Lightning's SimpleProfiler and prints
      "<calls>\t<action>" for every action it timed.
"""
import sys
import warnings

warnings.filterwarnings("ignore")


def report(path, total, stage, extended):
    from lightning.pytorch.profilers import simple
    from lightning.pytorch.profilers.simple import SimpleProfiler

    profiler = SimpleProfiler(extended=extended)
    with open(path) as f:
        for line in f:
            ns, action = line.rstrip("\n").split("\t", 1)
            profiler.recorded_durations[action].append(int(ns) / 1e9)
    profiler._stage = stage
    profiler.start_time = 0.0
    simple.time.perf_counter = lambda: total  # the clock both sides read
    sys.stdout.write(profiler.summary())


def fit():
    import logging

    import torch
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.profilers import SimpleProfiler

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    profiler = SimpleProfiler()
    trainer = L.Trainer(max_epochs=2, profiler=profiler, callbacks=[EarlyStopping("val_loss", patience=100)],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Net(), loader, loader)
    for action, durations in profiler.recorded_durations.items():
        print(f"{len(durations)}\t{action}")


if __name__ == "__main__":
    if sys.argv[1] == "report":
        report(sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5] == "1")
    else:
        fit()
