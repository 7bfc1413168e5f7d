"""Lightning's and torch's side of tests/unit/monitor_tests.cpp, computed at test time from the venv.

    monitor_reference.py throughput OUT       Lightning's Throughput on the update sequences the C++ test replays
    monitor_reference.py monitor OUT          a Lightning fit/validate/test with ThroughputMonitor on a scripted clock
    monitor_reference.py peak OUT             get_available_flops for device names x dtypes
    monitor_reference.py grad_norm IN OUT     Lightning's grad_norm on the gradients IN holds
    monitor_reference.py flops OUT            FlopCounterMode on the MLP the C++ test measures

Every output line is "<case> <key> <value>" (value: Python's repr of a float, or None), read by the C++ test.
"""
import sys
import types
import warnings

warnings.filterwarnings("ignore")


def clock():
    """The scripted clock both sides use: strictly increasing, uneven steps."""
    k = 0

    def tick():
        nonlocal k
        k += 1
        return 0.5 * k + 0.01 * k * k

    return tick


# The update sequences, replayed by the C++ test: (world_size, window_size, available_flops, with_lengths, with_flops).
THROUGHPUT_CASES = [(1, 2, None, False, False), (1, 3, 5e6, True, True), (3, 4, 2e7, True, True), (2, 3, None, False, True)]


def throughput(out):
    from lightning.fabric.utilities.throughput import Throughput

    for case, (world, window, peak, lengths, flops) in enumerate(THROUGHPUT_CASES):
        t = Throughput(available_flops=peak, world_size=world, window_size=window)
        tick = clock()
        samples = length = 0
        for i in range(1, 8):
            samples += 3 + i % 2
            length += 7 * (3 + i % 2) + i
            t.update(time=tick(), batches=i, samples=samples, lengths=length if lengths else None,
                     flops=1000 + 37 * i if flops else None)
            for key, value in sorted(t.compute().items()):
                out.write(f"{case}.{i} {key} {float(value)!r}\n")


def recording_logger(keep):
    """A Lightning logger that records (step, keep(metrics)) for each log_metrics call keep leaves non-empty."""
    from lightning.pytorch.loggers import Logger

    class Recorder(Logger):
        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def name(self):
            return "recorder"

        @property
        def version(self):
            return 0

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            kept = keep(dict(metrics))
            if kept:
                self.calls.append((step, kept))

    return Recorder()


def monitor(out):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ThroughputMonitor
    from lightning.pytorch.callbacks import throughput_monitor as tm

    tm.time = types.SimpleNamespace(perf_counter=clock())  # the monitor's clock only

    class Net(pl.LightningModule):
        flops_per_batch = 1000

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def training_step(self, batch, i):
            return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

        def validation_step(self, batch, i):
            return self.training_step(batch, i)

        def test_step(self, batch, i):
            return self.training_step(batch, i)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def loader(n):
        return DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(3, (n,))), batch_size=4)

    recorder = recording_logger(
        lambda metrics: metrics if any(k.split("/")[0] in ("train", "validate", "test", "predict") for k in metrics)
        else {})
    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].size(0), length_fn=lambda b: b[0].numel(), window_size=2)
    trainer = pl.Trainer(max_epochs=2, accumulate_grad_batches=2, log_every_n_steps=2, logger=recorder,
                         callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    net = Net()
    trainer.fit(net, loader(24), loader(12))
    trainer.validate(net, loader(12), verbose=False)
    trainer.test(net, loader(12), verbose=False)
    for n, (step, metrics) in enumerate(recorder.calls):
        for key, value in sorted(metrics.items()):
            out.write(f"{n} {key} {float(value)!r}\n")
        out.write(f"{n} step {float(step)!r}\n")


def lr_monitor(out):
    """LearningRateMonitor (log_momentum, log_weight_decay) over the schedulers of issue 34: CyclicLR per step
    cycling SGD's momentum, and ChainedScheduler(ConstantLR, PolynomialLR) per epoch on Adam (beta1 as momentum)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LearningRateMonitor
    from torch.optim import lr_scheduler as sched

    class Net(pl.LightningModule):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            self.fc = torch.nn.Linear(8, 3)

        def training_step(self, batch, i):
            return torch.nn.functional.cross_entropy(self.fc(batch[0]), batch[1])

        def configure_optimizers(self):
            if self.kind == "cyclic":
                sgd = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
                cyclic = sched.CyclicLR(sgd, base_lr=0.01, max_lr=0.1, step_size_up=3, mode="triangular2")
                return {"optimizer": sgd, "lr_scheduler": {"scheduler": cyclic, "interval": "step"}}
            adam = torch.optim.Adam(self.parameters(), lr=0.01, betas=(0.85, 0.99))
            chained = sched.ChainedScheduler([sched.ConstantLR(adam, factor=0.5, total_iters=2),
                                              sched.PolynomialLR(adam, total_iters=3, power=2.0)])
            return {"optimizer": adam, "lr_scheduler": {"scheduler": chained, "interval": "epoch"}}

    for kind in ("cyclic", "chained"):
        recorder = recording_logger(lambda metrics: {k: v for k, v in metrics.items() if k.startswith("lr-")})
        trainer = pl.Trainer(max_epochs=3, log_every_n_steps=1, logger=recorder,
                             callbacks=[LearningRateMonitor(log_momentum=True, log_weight_decay=True)],
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator="cpu", devices=1)
        data = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(3, (16,))), batch_size=4)
        trainer.fit(Net(kind), data)
        for n, (step, metrics) in enumerate(recorder.calls):
            for key, value in sorted(metrics.items()):
                out.write(f"{kind}{n} {key} {float(value)!r}\n")
            out.write(f"{kind}{n} step {float(step)!r}\n")


PEAK_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 SXM1",
              "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3080 Ti",
              "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA L4", "Tesla L40", "NVIDIA A10G", "Tesla T4", "Tesla V100-SXM2-16GB",
              "NVIDIA RTX A6000", "Quadro RTX 5000", "NVIDIA TITAN RTX", "NVIDIA A40", "Some Other GPU", "GeForce RTX"]
PEAK_DTYPES = ["float64", "float32", "tfloat32", "bfloat16", "float16", "int8", "int4"]


def peak(out):
    import torch
    import lightning.fabric.utilities.throughput as tp
    import lightning.fabric.accelerators.cuda as cuda

    cuda._is_ampere_or_later = lambda *a, **k: False  # float32 stays float32; tfloat32 is asked for by name
    dtypes = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "int8": torch.int8, "tfloat32": "tfloat32", "int4": "int4"}
    for n, name in enumerate(PEAK_NAMES):
        torch.cuda.get_device_name = lambda device=None, name=name: name
        for dtype in PEAK_DTYPES:
            try:
                value = tp.get_available_flops(torch.device("cuda", 0), dtypes[dtype])
            except IndexError:  # Lightning's parsing of a short "geforce rtx" name
                value = None
            out.write(f"{n} {dtype} {None if value is None else float(value)!r}\n")


def grad_norm(path, out):
    import torch
    from lightning.pytorch.utilities import grad_norm as lightning_grad_norm

    root = torch.nn.Module()
    with open(path) as f:
        norm_types = [float(x) for x in f.readline().split()]
        for line in f:
            name, shape, *values = line.split()
            module = root
            *parents, leaf = name.split(".")
            for part in parents:
                if not hasattr(module, part):
                    module.add_module(part, torch.nn.Module())
                module = getattr(module, part)
            dims = [int(d) for d in shape.split(",")] if shape != "-" else []
            p = torch.nn.Parameter(torch.zeros(dims))
            module.register_parameter(leaf, p)
            if values[0] != "none":
                p.grad = torch.tensor([float(v) for v in values], dtype=torch.float32).reshape(dims)
    for norm_type in norm_types:
        for key, value in lightning_grad_norm(root, norm_type).items():
            out.write(f"{norm_type!r} {key} {float(value)!r}\n")


def flops(out):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    x = torch.randn(12, 32)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    out.write(f"mlp total {float(counter.get_total_flops())!r}\n")
    counter = FlopCounterMode(display=False)
    with counter:
        model(x)
    out.write(f"mlp forward {float(counter.get_total_flops())!r}\n")


if __name__ == "__main__":
    command = sys.argv[1]
    with open(sys.argv[-1], "w") as out:
        if command == "grad_norm":
            grad_norm(sys.argv[2], out)
        else:
            {"throughput": throughput, "monitor": monitor, "lr_monitor": lr_monitor, "peak": peak,
             "flops": flops}[command](out)
