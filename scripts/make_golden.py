#!/usr/bin/env python3
"""Golden values from Python torch (torch.amp.GradScaler, torch.autocast, clip_grad_*_, randperm).

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


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    grad_scaler(out)
    autocast(out)
    clipping(out)
    shuffling(out)
    distributed_sampler(out)
    print(f"golden values written to {out} (torch {torch.__version__})")
