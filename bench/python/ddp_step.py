"""The Python side of bench_ddp: the same MLP, data sizes, optimizer and thread count as
bench/ddp_worker.cpp, trained with torch.nn.parallel.DistributedDataParallel on Gloo under torchrun.
Prints "step_us <mean microseconds per step>" from rank 0."""
import os
import time

import torch
import torch.distributed as dist

IN, HIDDEN, CLASSES, BATCH, WARMUP, STEPS = 256, 512, 10, 64, 10, 60


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-2, momentum=0.9)
    batches = [(torch.randn(BATCH, IN), torch.randint(CLASSES, (BATCH,))) for _ in range(WARMUP + STEPS)]

    def train(part):
        for x, y in part:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    train(batches[:WARMUP])
    dist.barrier()
    start = time.perf_counter()
    train(batches[WARMUP:])
    dist.barrier()
    step_us = (time.perf_counter() - start) * 1e6 / STEPS
    if dist.get_rank() == 0:
        print(f"step_us {step_us}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
