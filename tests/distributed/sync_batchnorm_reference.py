"""Reference values for tests/distributed/sync_batchnorm_worker.cpp, made at test time.

Run under torchrun with N ranks on Gloo: every rank runs PyTorch's own SyncBatchNorm autograd
function (torch.nn.modules._functions.SyncBatchNorm: its all_gather of the statistics, masking,
all_reduce of sum_dy / sum_dy_xmu) on its part of the batch. torch.nn.SyncBatchNorm refuses CPU
tensors ("SyncBatchNorm expected input tensor to be on GPU ...") and the kernels the function calls
(torch.batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_elemt,
batch_norm_backward_reduce, batch_norm_backward_elemt) exist for CUDA only, so CPU versions written
from the CUDA kernels (aten/src/ATen/native/cuda/Normalization.cuh) are put in their place; the
module's forward (num_batches_tracked, momentum=None) is followed as written in batchnorm.py.
Rank 0 also computes one process with the whole batch (torch.nn.BatchNorm{1,2,3}d).

usage: torchrun --nproc-per-node=N sync_batchnorm_reference.py OUT_DIR
Writes OUT_DIR/<case>/<name>.bin (raw little-endian values of the case's dtype) per rank
(`<name>.rank<r>.bin`) and for the whole batch (`whole.<name>.bin`), then OUT_DIR/done.<rank>.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.modules import _functions

# name, BatchNorm dims, channels, the per-sample shape after C, momentum, affine, dtype, batch of rank r
CASES = [
    ("bn2d", 2, 3, (4, 5), 0.1, True, torch.float64, lambda r: 2 + r),
    ("bn1d", 1, 4, (6,), 0.3, True, torch.float64, lambda r: 3 + 2 * r),
    ("flat_one_per_rank", 1, 5, (), None, True, torch.float64, lambda r: 1),
    ("bn3d_no_affine", 3, 2, (2, 3, 2), 0.1, False, torch.float64, lambda r: 2),
    ("bn2d_float32", 2, 3, (4, 5), 0.1, True, torch.float32, lambda r: 2 + r),
]
EPS = 1e-5


# ---- CPU versions of the CUDA-only kernels SyncBatchNorm's function calls ----------------------
def _dims(x):
    return [0] + list(range(2, x.dim()))


def _shape(x):
    return [1, x.size(1)] + [1] * (x.dim() - 2)


def batch_norm_stats(x, eps):
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xs = x.to(acc)
    mean = xs.mean(_dims(x))
    var = xs.var(_dims(x), unbiased=False)
    return mean, 1.0 / torch.sqrt(var + eps)


def batch_norm_gather_stats_with_counts(x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts):
    # batch_norm_reduce_statistics_kernel: the ranks folded in one after another (Chan et al.)
    channels = mean_all.size(1)
    mean = torch.zeros(channels, dtype=mean_all.dtype)
    invstd = torch.zeros(channels, dtype=mean_all.dtype)
    for c in range(channels):
        avg = 0.0
        var_n = 0.0
        n = 0.0
        for j in range(mean_all.size(0)):
            count = counts[j].item()
            m = mean_all[j, c].item()
            v = 1.0 / (invstd_all[j, c].item() ** 2) - eps
            factor = 1.0 / (n + count)
            var_n += v * count + (m - avg) ** 2 * n * count * factor
            avg = n * factor * avg + count * factor * m
            n += count
        mean[c] = avg
        invstd[c] = 1.0 / (var_n / n + eps) ** 0.5
        if running_mean is not None:
            running_mean[c] = momentum * avg + (1 - momentum) * running_mean[c]
        if running_var is not None:
            running_var[c] = momentum * var_n / (n - 1) + (1 - momentum) * running_var[c]
    return mean, invstd


def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
    s = _shape(x)
    w = weight.view(s) if weight is not None else 1.0
    b = bias.view(s) if bias is not None else 0.0
    return (w * (x - mean.view(s)) * invstd.view(s) + b).to(x.dtype)


def batch_norm_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    s = _shape(x)
    sum_dy = dy.sum(_dims(x))
    sum_dy_xmu = (dy * (x - mean.view(s))).sum(_dims(x))
    grad_weight = sum_dy_xmu * invstd if weight_g else None
    grad_bias = sum_dy if bias_g else None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    s = _shape(x)
    total = count.sum().to(mean.dtype)
    w = weight.view(s) if weight is not None else 1.0
    mean_dy = (sum_dy / total).view(s)
    mean_dy_xmu = (sum_dy_xmu / total).view(s)
    factor_1 = invstd.view(s) * invstd.view(s) * mean_dy_xmu
    factor_2 = w * invstd.view(s)
    return ((dy - mean_dy - (x - mean.view(s)) * factor_1) * factor_2).to(x.dtype)


for _name, _fn in list(globals().items()):
    if _name.startswith("batch_norm_"):
        setattr(torch, _name, _fn)


def sync_forward(bn, x, group, world):
    """torch.nn.SyncBatchNorm.forward's training path, verbatim but for the device check."""
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats:
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / bn.num_batches_tracked.item() if bn.momentum is None else bn.momentum
    return _functions.SyncBatchNorm.apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps, factor,
                                          group, world)


def case_data(name, dims, channels, sample, affine, dtype, batch, world):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    n = sum(batch(r) for r in range(world))
    x = torch.randn((n, channels) + tuple(sample), generator=g, dtype=torch.float64) * 2 + 0.5
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    state = {
        "running_mean": torch.randn(channels, generator=g, dtype=torch.float64) * 0.1,
        "running_var": torch.rand(channels, generator=g, dtype=torch.float64) + 0.5,
    }
    if affine:
        state["weight"] = torch.randn(channels, generator=g, dtype=torch.float64)
        state["bias"] = torch.randn(channels, generator=g, dtype=torch.float64)
    return x.to(dtype), dy.to(dtype), {k: v.to(dtype) for k, v in state.items()}


def make_bn(dims, channels, momentum, affine, dtype, state):
    bn = getattr(torch.nn, f"BatchNorm{dims}d")(channels, eps=EPS, momentum=momentum, affine=affine).to(dtype)
    with torch.no_grad():
        for k, v in state.items():
            getattr(bn, k).copy_(v)
    return bn


def save(path, tensor):
    tensor.detach().contiguous().cpu().numpy().tofile(path)


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    for name, dims, channels, sample, momentum, affine, dtype, batch in CASES:
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        x, dy, state = case_data(name, dims, channels, sample, affine, dtype, batch, world)
        if rank == 0:
            for k, v in [("x", x), ("dy", dy)] + list(state.items()):
                save(os.path.join(folder, f"input.{k}.bin"), v)
        start = sum(batch(r) for r in range(rank))
        part = x[start:start + batch(rank)].clone().requires_grad_(True)
        bn = make_bn(dims, channels, momentum, affine, dtype, state)
        y = sync_forward(bn, part, group, world)
        y.backward(dy[start:start + batch(rank)])
        results = {"y": y, "grad_x": part.grad, "running_mean": bn.running_mean, "running_var": bn.running_var}
        if affine:
            results.update(grad_weight=bn.weight.grad, grad_bias=bn.bias.grad)
        for k, v in results.items():
            save(os.path.join(folder, f"{k}.rank{rank}.bin"), v)
        if rank == 0:  # one process, the whole batch
            whole = make_bn(dims, channels, momentum, affine, dtype, state)
            xw = x.clone().requires_grad_(True)
            yw = whole(xw)
            yw.backward(dy)
            results = {"y": yw, "grad_x": xw.grad, "running_mean": whole.running_mean,
                       "running_var": whole.running_var}
            if affine:
                results.update(grad_weight=whole.weight.grad, grad_bias=whole.bias.grad)
            for k, v in results.items():
                save(os.path.join(folder, f"whole.{k}.bin"), v)
    dist.barrier()
    open(os.path.join(out, f"done.{rank}"), "w").close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
