#!/usr/bin/env python3
"""Golden values from Python torch (torch.amp.GradScaler, torch.autocast, clip_grad_*_, randperm,
torch.optim's fused optimizers, torch.optim.lr_scheduler).

Writes one text file per scenario into the folder given as argv[1]. Each line is
    <key> <dtype> <shape, comma-separated or '-'> <values as float.hex ...>
The C++ tests read the inputs from the same file, run fulgur, and compare exactly.
"""
import math
import os
import sys

import torch


def write(path, entries):
    with open(path, "w") as f:
        for key, t in entries:
            t = torch.as_tensor(t)
            shape = ",".join(str(s) for s in t.shape) or "-"
            values = " ".join(float(v).hex() for v in t.detach().reshape(-1).double().tolist())
            f.write(f"{key} {str(t.dtype).replace('torch.', '')} {shape} {values}\n")


def grad_scaler(out):
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(torch.randn(5))
    entries = [("init.a", a.detach().clone()), ("init.b", b.detach().clone())]
    opt = torch.optim.SGD([a, b], lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    inject = {2: math.inf, 6: math.nan}  # step -> value written into b.grad[1] after backward
    for step in range(12):
        loss = (a ** 2).sum() * 0.5 + (b * torch.arange(5.0)).sum()
        scaler.scale(loss).backward()
        if step in inject:
            with torch.no_grad():
                b.grad[1] = inject[step]
        before = a.detach().clone()
        scaler.step(opt)
        stepped = not torch.equal(before, a.detach())
        scaler.update()
        opt.zero_grad()
        entries += [
            (f"step{step}.scale", torch.tensor(scaler.get_scale())),
            (f"step{step}.tracker", torch.tensor(float(scaler._get_growth_tracker()))),
            (f"step{step}.stepped", torch.tensor(float(stepped))),
            (f"step{step}.a", a.detach().clone()),
            (f"step{step}.b", b.detach().clone()),
        ]
    state = scaler.state_dict()
    entries += [(f"state.{k}", torch.tensor(float(v))) for k, v in state.items()]
    write(os.path.join(out, "grad_scaler.txt"), entries)
    with open(os.path.join(out, "grad_scaler_keys.txt"), "w") as f:
        f.write(" ".join(state.keys()) + "\n")


def autocast(out):
    torch.manual_seed(1)
    x = torch.randn(8, 16)
    w = torch.randn(4, 16)
    bias = torch.randn(4)
    target = torch.randn(8, 4)
    entries = [("x", x), ("w", w), ("bias", bias), ("target", target)]
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with torch.autocast("cpu", dtype=dtype):
            y = torch.nn.functional.linear(x, w, bias)
            mm = torch.mm(x, w.t())
            loss = torch.nn.functional.mse_loss(y, target)
            soft = torch.log_softmax(y, dim=1)
            summed = y + 1.0
        entries += [(f"{name}.linear", y), (f"{name}.mm", mm), (f"{name}.mse", loss), (f"{name}.log_softmax", soft),
                    (f"{name}.add", summed)]
    write(os.path.join(out, "autocast.txt"), entries)


def clipping(out):
    torch.manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(7))]
    grads = [torch.randn(3, 4) * 3, torch.randn(7) * 3]
    entries = [("grad0", grads[0]), ("grad1", grads[1])]
    for tag, max_norm, norm_type in (("l2", 0.5, 2.0), ("inf", 0.25, math.inf), ("l1", 100.0, 1.0)):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        entries += [(f"{tag}.total", total), (f"{tag}.g0", params[0].grad), (f"{tag}.g1", params[1].grad)]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_value_(params, 0.7)
    entries += [("value.g0", params[0].grad), ("value.g1", params[1].grad)]
    write(os.path.join(out, "clipping.txt"), entries)


def shuffling(out):
    entries = []
    for n, seed, epoch in ((10, 0, 0), (10, 0, 1), (97, 42, 3), (1000, 7, 0)):
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        entries.append((f"perm.{n}.{seed}.{epoch}", torch.randperm(n, generator=g).double()))
    write(os.path.join(out, "shuffle.txt"), entries)


def distributed_sampler(out):
    """Python's DistributedSampler indices for (N, world, rank, shuffle, seed, epoch, drop_last)."""
    from torch.utils.data.distributed import DistributedSampler

    entries = []
    cases = [(10, 2, 0, True, 0, 0, False), (10, 2, 1, True, 0, 0, False), (10, 3, 2, True, 0, 1, False),
             (11, 4, 3, True, 5, 2, False), (11, 4, 3, True, 5, 2, True), (11, 4, 0, False, 0, 0, False),
             (3, 4, 3, True, 1, 0, False), (100, 7, 6, True, 42, 9, True), (100, 7, 2, False, 0, 0, True),
             (1, 2, 1, True, 0, 0, False)]
    for n, world, rank, shuffle, seed, epoch, drop_last in cases:
        sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last)
        sampler.set_epoch(epoch)
        key = f"sampler.{n}.{world}.{rank}.{int(shuffle)}.{seed}.{epoch}.{int(drop_last)}"
        entries.append((key, torch.tensor(list(iter(sampler)), dtype=torch.float64)))
    write(os.path.join(out, "distributed_sampler.txt"), entries)


# The fused optimizers' scenarios: name -> (torch.optim class, its keyword arguments). The C++ test
# (tests/unit/optim_tests.cpp) builds fulgur's FusedAdam/FusedAdamW/FusedSGD from the same options.
FUSED = {
    "adam": (torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.9), eps=1e-6, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-2)),
}


def fused_optimizers(out):
    """Each scenario: torch.optim's fused=True optimizer over two parameters, 5 steps on given
    gradients; and under torch.amp.GradScaler, 6 steps of a loss with an inf injected at step 2
    (a skipped step in the middle of the run)."""
    for name, (cls, kwargs) in FUSED.items():
        torch.manual_seed(2)
        a = torch.nn.Parameter(torch.randn(4, 3))
        b = torch.nn.Parameter(torch.randn(5))
        entries = [("init.a", a.detach().clone()), ("init.b", b.detach().clone())]
        opt = cls([a, b], fused=True, **kwargs)
        for step in range(5):
            a.grad, b.grad = torch.randn(4, 3), torch.randn(5)
            entries += [(f"grad{step}.a", a.grad.clone()), (f"grad{step}.b", b.grad.clone())]
            opt.step()
            entries += [(f"step{step}.a", a.detach().clone()), (f"step{step}.b", b.detach().clone())]
        for key, value in opt.state[a].items():
            entries.append((f"state.a.{key}", value.clone()))
        write(os.path.join(out, f"fused_{name}.txt"), entries)

        torch.manual_seed(3)
        a = torch.nn.Parameter(torch.randn(4, 3))
        b = torch.nn.Parameter(torch.randn(5))
        entries = [("init.a", a.detach().clone()), ("init.b", b.detach().clone())]
        opt = cls([a, b], fused=True, **kwargs)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        for step in range(6):
            loss = (a ** 2).sum() * 0.5 + (b * torch.arange(5.0)).sum() + (a[:, 0] * b[:4]).sum()
            scaler.scale(loss).backward()
            if step == 2:
                with torch.no_grad():
                    b.grad[1] = math.inf
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            entries += [(f"scaled{step}.a", a.detach().clone()), (f"scaled{step}.b", b.detach().clone()),
                        (f"scaled{step}.scale", torch.tensor(scaler.get_scale()))]
            for key, value in opt.state[a].items():
                entries.append((f"scaled{step}.state.a.{key}", value.clone()))
        write(os.path.join(out, f"fused_{name}_scaled.txt"), entries)


# The schedulers' scenarios: name -> (optimizer, scheduler factory). tests/unit/lr_scheduler_tests.cpp
# builds fulgur::optim's scheduler of the same name with the same arguments. Two param groups (lr 0.1
# and 0.05), 12 steps, each after an optimizer step.
PLATEAU_METRICS = [1.0, 0.9, 0.95, 0.97, 0.96, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]


def _scheduler_scenarios():
    S = torch.optim.lr_scheduler
    return {
        "step": ("sgd", lambda o: S.StepLR(o, step_size=2, gamma=0.5)),
        "multistep": ("sgd", lambda o: S.MultiStepLR(o, milestones=[2, 5, 5], gamma=0.3)),
        "exponential": ("sgd", lambda o: S.ExponentialLR(o, gamma=0.9)),
        "cosine": ("sgd", lambda o: S.CosineAnnealingLR(o, T_max=4, eta_min=0.001)),
        "warm_restarts": ("sgd", lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001)),
        "linear": ("sgd", lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4)),
        "onecycle": ("sgd", lambda o: S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=12)),
        "onecycle_adam": ("adam", lambda o: S.OneCycleLR(o, max_lr=0.01, total_steps=12, anneal_strategy="linear",
                                                       three_phase=True)),
        "lambda": ("sgd", lambda o: S.LambdaLR(o, lambda e: 0.95 ** e)),
        "sequential": ("sgd", lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=3), S.CosineAnnealingLR(o, T_max=6)],
            milestones=[3])),
        "plateau": ("sgd", lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1, threshold=0.01, cooldown=1)),
        "plateau_max_abs": ("sgd", lambda o: S.ReduceLROnPlateau(o, mode="max", factor=0.5, patience=0, threshold=0.05,
                                                               threshold_mode="abs", min_lr=[0.02, 0.01])),
        "constant": ("sgd", lambda o: S.ConstantLR(o, factor=0.5, total_iters=4)),
        "polynomial": ("sgd", lambda o: S.PolynomialLR(o, total_iters=8, power=2.0)),
        "multiplicative": ("sgd", lambda o: S.MultiplicativeLR(o, lambda e: 0.95 - 0.01 * (e % 3))),
        "cyclic": ("sgd", lambda o: S.CyclicLR(o, base_lr=[0.01, 0.005], max_lr=[0.1, 0.05], step_size_up=3,
                                               step_size_down=2, mode="triangular2")),
        "cyclic_adam": ("adam", lambda o: S.CyclicLR(o, base_lr=0.001, max_lr=0.01, step_size_up=2, mode="exp_range",
                                                     gamma=0.9, base_momentum=0.85, max_momentum=0.95)),
        "cyclic_custom": ("sgd", lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4,
                                                      scale_fn=lambda x: 1.0 / (x + 1.0), scale_mode="iterations",
                                                      cycle_momentum=False)),
        "chained": ("sgd", lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=3),
                                                         S.ExponentialLR(o, gamma=0.9)], optimizer=o)),
        "sequential_new": ("sgd", lambda o: S.SequentialLR(
            o, [S.ConstantLR(o, factor=0.5, total_iters=2), S.PolynomialLR(o, total_iters=6, power=1.5),
                S.MultiplicativeLR(o, lambda e: 0.9)], milestones=[3, 7])),
        "sequential_cyclic": ("sgd", lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.5, end_factor=1.0, total_iters=2),
                S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2)], milestones=[4])),
        "sequential_chained": ("sgd", lambda o: S.SequentialLR(
            o, [S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=2), S.ExponentialLR(o, gamma=0.9)]),
                S.StepLR(o, step_size=2, gamma=0.5)], milestones=[5])),
    }


def _flat_state(state, prefix=""):
    """(key, number or list of numbers) of a scheduler's state_dict, nested ones as prefix.key."""
    out = []
    for key, value in state.items():
        if isinstance(value, bool):
            out.append((prefix + key, float(value)))
        elif isinstance(value, (int, float)):
            out.append((prefix + key, float(value)))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value) and value:
            out.append((prefix + key, [float(v) for v in value]))
        elif key == "_schedulers":
            for i, child in enumerate(value):
                out += _flat_state(child, f"{prefix}{key}.{i}.")
    return out


def _scenario(kind, make, params):
    """A scenario's optimizer (two groups, lr 0.1 and 0.05, on params[0] and params[1]), its scheduler, and
    record(tag): each group's lr and momentum, get_last_lr() and last_epoch (-1 for ChainedScheduler, which has none)."""
    groups = [{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.05}]
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9) if kind == "sgd" else torch.optim.Adam(groups, lr=0.1)
    sched = make(opt)

    def record(tag):
        momentum = [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]
        return [(f"{tag}.lr", torch.tensor([g["lr"] for g in opt.param_groups], dtype=torch.float64)),
                (f"{tag}.last", torch.tensor(sched.get_last_lr(), dtype=torch.float64)),
                (f"{tag}.momentum", torch.tensor(momentum, dtype=torch.float64)),
                (f"{tag}.epoch", torch.tensor(float(getattr(sched, "last_epoch", -1)), dtype=torch.float64))]

    return opt, sched, isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau), record


def schedulers(out):
    for name, (kind, make) in _scheduler_scenarios().items():
        opt, sched, plateau, record = _scenario(kind, make, [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)])
        entries = record("init")
        for step in range(12):
            opt.step()
            if plateau:
                sched.step(PLATEAU_METRICS[step])
            else:
                sched.step()
            entries += record(f"step{step}")
        state = sched.state_dict()
        entries += [(f"state.{k}", torch.tensor(v, dtype=torch.float64)) for k, v in _flat_state(state)]
        write(os.path.join(out, f"scheduler_{name}.txt"), entries)
        with open(os.path.join(out, f"scheduler_{name}_keys.txt"), "w") as f:
            f.write(" ".join(state.keys()) + "\n")


# A param group added after the scheduler was made (as Lightning's BackboneFinetuning adds the backbone's):
# the scenarios above, and a few more, stepped 3 times, then a third group (lr 0.02, the optimizer's
# defaults otherwise) added, then stepped up to step 11. PyTorch's step zips the groups with what the
# schedule returns (strict=True): forms that scale each group's own lr take the new group in, those
# built on the lists made with the scheduler raise. Where it raises: "raised" (the step), the lrs,
# last lrs and last_epoch it left, and its message (scheduler_grown_<name>_message.txt).
GROWN_AFTER = 3
_GROWN_BASE = ("step", "multistep", "exponential", "cosine", "warm_restarts", "linear", "onecycle", "onecycle_adam",
               "lambda", "sequential", "plateau", "plateau_max_abs", "constant", "polynomial", "multiplicative", "cyclic",
               "chained")


def _grown_scenarios():
    S = torch.optim.lr_scheduler
    scenarios = {k: v for k, v in _scheduler_scenarios().items() if k in _GROWN_BASE}
    scenarios.update({
        "cosine_long": ("sgd", lambda o: S.CosineAnnealingLR(o, T_max=20, eta_min=0.001)),
        "sequential_late": ("sgd", lambda o: S.SequentialLR(
            o, [S.StepLR(o, step_size=2, gamma=0.5), S.ExponentialLR(o, gamma=0.9)], milestones=[6])),
        "swalr": ("sgd", lambda o: torch.optim.swa_utils.SWALR(o, swa_lr=0.05, anneal_epochs=3)),
    })
    return scenarios


def grown_schedulers(out):
    for name, (kind, make) in _grown_scenarios().items():
        params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
        opt, sched, plateau, record = _scenario(kind, make, params)
        entries, message = [], ""
        for step in range(12):
            if step == GROWN_AFTER:
                opt.add_param_group({"params": [params[2]], "lr": 0.02})
                entries += record("grown")
            opt.step()
            try:
                sched.step(PLATEAU_METRICS[step]) if plateau else sched.step()
            except Exception as error:  # noqa: BLE001 - what PyTorch raises is the reference
                entries += [("raised", torch.tensor(float(step), dtype=torch.float64))] + record("fail")
                message = f"{type(error).__name__}: {error}"
                break
            entries += record(f"step{step}")
        state = sched.state_dict()
        entries += [(f"state.{k}", torch.tensor(v, dtype=torch.float64)) for k, v in _flat_state(state)]
        write(os.path.join(out, f"scheduler_grown_{name}.txt"), entries)
        with open(os.path.join(out, f"scheduler_grown_{name}_message.txt"), "w") as f:
            f.write(message + "\n")


def _python_error(make):
    try:
        make()
    except Exception as error:  # noqa: BLE001 - what PyTorch raises is the reference
        return f"{type(error).__name__}: {error}"
    return "no error"


def scheduler_errors(out):
    """The messages PyTorch raises on the new schedulers' bad arguments: scheduler_errors.txt, `name message` a line."""
    S = torch.optim.lr_scheduler

    def sgd():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))], lr=0.1)

    def two_groups():
        p = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
        return torch.optim.SGD([{"params": [p[0]]}, {"params": [p[1]], "lr": 0.05}], lr=0.1, momentum=0.9)

    def constant_zero():
        o = sgd()
        s = S.ConstantLR(o, factor=0.0, total_iters=2)
        for _ in range(2):
            s.step()

    o1, o2 = sgd(), sgd()
    errors = {
        "constant_factor": lambda: S.ConstantLR(sgd(), factor=1.5),
        "constant_zero": constant_zero,
        "multiplicative_lambdas": lambda: S.MultiplicativeLR(two_groups(), [lambda e: 1.0] * 3),
        "cyclic_no_momentum": lambda: S.CyclicLR(torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(2))], lr=0.1),
                                                 base_lr=0.01, max_lr=0.1),
        "cyclic_max_lr": lambda: S.CyclicLR(two_groups(), base_lr=0.01, max_lr=[0.1, 0.2, 0.3]),
        "cyclic_base_momentum": lambda: S.CyclicLR(two_groups(), base_lr=0.01, max_lr=0.1, base_momentum=[0.8] * 3),
        "chained_empty": lambda: S.ChainedScheduler([]),
        "chained_optimizers": lambda: S.ChainedScheduler([S.StepLR(o1, 2), S.ExponentialLR(o2, 0.9)]),
    }
    with open(os.path.join(out, "scheduler_errors.txt"), "w") as f:
        for name, make in errors.items():
            f.write(f"{name} {_python_error(make).splitlines()[0]}\n")  # the first line: an optimizer prints many


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    grad_scaler(out)
    autocast(out)
    clipping(out)
    shuffling(out)
    distributed_sampler(out)
    fused_optimizers(out)
    schedulers(out)
    grown_schedulers(out)
    scheduler_errors(out)
    print(f"golden values written to {out} (torch {torch.__version__})")
