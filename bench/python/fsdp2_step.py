"""bench_ddp's Python FSDP2 side: the model (the MLP, or the GPT: step_timing.py), data sizes,
optimizer and thread count of bench/ddp_worker.cpp, each Linear (the GPT: each block) sharded with
torch.distributed.fsdp.fully_shard (FSDP2) and the root wrapped too, on Gloo and CPU under torchrun —
the counterpart of fulgur's ShardedStrategy<3> with WrapPolicy::by_type<Linear> (<Block>). Prints
"step_us <mean microseconds per step>" from rank 0."""
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from step_timing import gpt_model, model, time_steps


def main():
    dist.init_process_group("gloo")
    net = model()
    mesh = dist.device_mesh.init_device_mesh("cpu", (dist.get_world_size(),))
    if gpt_model():  # each block, as fulgur's WrapPolicy::by_type<Block>
        for block in net.blocks:
            fully_shard(block, mesh=mesh)
    else:
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    time_steps(net)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
