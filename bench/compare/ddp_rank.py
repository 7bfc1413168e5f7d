"""One rank of `compare.py --ddp` (see there), started by torchrun --standalone:

    torchrun --standalone --nproc-per-node=R bench/compare/ddp_rank.py torch|lightning DIR WARMUP

Trains compare.py's MLP from DIR/init.pt on this rank's slice of each global batch of DIR/data.pt (rank r:
rows 64r..64r+63), on Gloo: "torch" is compare.raw_pytorch's loop around DistributedDataParallel, "lightning"
compare.trainer with strategy="ddp" (no distributed sampler: the loader holds the slice). Rank 0 prints
{"step_us": <µs per step from step WARMUP on, between barriers>, "losses": [<its own loss of each step>]}.
"""
import json
import os
import sys

import compare  # first: one intra-op thread
import torch
import torch.distributed as dist


def main():
    framework, folder, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init = torch.load(os.path.join(folder, "init.pt"))
    data = torch.load(os.path.join(folder, "data.pt"))
    rows = slice(rank * compare.DDP_BATCH, (rank + 1) * compare.DDP_BATCH)
    xs, ys = [x[rows] for x in data["x"]], [y[rows] for y in data["y"]]
    window = compare.Window(warmup, len(xs) - 1, dist.barrier)  # every rank arrives before and after
    if framework == "torch":
        dist.init_process_group("gloo")
        _, losses = compare.raw_pytorch("32-true", init, xs, ys, wrap=torch.nn.parallel.DistributedDataParallel,
                                        window=window)
    else:  # Lightning meets the other ranks itself
        _, losses = compare.trainer("32-true", init, xs, ys, strategy="ddp", devices=ranks, window=window)
    if rank == 0:
        print(json.dumps({"step_us": window.step_us(), "losses": losses}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
