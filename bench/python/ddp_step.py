"""The Python side of bench_ddp: the same model (the MLP, or the GPT: step_timing.py), data sizes,
optimizer and thread count as bench/ddp_worker.cpp, trained with
torch.nn.parallel.DistributedDataParallel on Gloo under torchrun. Prints "step_us <mean
microseconds per step>" from rank 0."""
import torch
import torch.distributed as dist

from step_timing import model, time_steps


def main():
    dist.init_process_group("gloo")
    time_steps(torch.nn.parallel.DistributedDataParallel(model()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
