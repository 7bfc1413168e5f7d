"""What bench_ddp's Python sides share: the model of bench/ddp_worker.cpp (its MLP, or with
FULGUR_BENCH_MODEL=gpt the GPT of bench/matrix/gpt.hpp at 4.2M parameters, built by
bench/compare/compare.py's GPT under the same names), its data and optimizer, and the timed loop
(warm-up, barrier, timed steps, barrier); prints "step_us <mean microseconds per step>" from rank 0."""
import os
import sys
import time

import torch
import torch.distributed as dist

IN, HIDDEN, CLASSES, BATCH, WARMUP, STEPS = 256, 512, 10, 64, 10, 60
GPT_SHAPE = dict(vocab=2048, width=256, heads=4, context=64, layers=4)  # ddp_worker.cpp's kGpt
GPT_BATCH, GPT_WARMUP, GPT_STEPS = 8, 2, 10


def gpt_model():
    return os.environ.get("FULGUR_BENCH_MODEL") == "gpt"


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def gpt():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
    from compare import GPT
    torch.manual_seed(0)
    return GPT(**GPT_SHAPE)


def model():
    """The model the worker trains (FULGUR_BENCH_MODEL)."""
    return gpt() if gpt_model() else mlp()


def time_steps(model):
    if gpt_model():
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        texts = [torch.randint(GPT_SHAPE["vocab"], (GPT_BATCH, GPT_SHAPE["context"] + 1))
                 for _ in range(GPT_WARMUP + GPT_STEPS)]
        batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in texts]
        warmup, steps = GPT_WARMUP, GPT_STEPS

        def loss_of(x, y):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        batches = [(torch.randn(BATCH, IN), torch.randint(CLASSES, (BATCH,))) for _ in range(WARMUP + STEPS)]
        warmup, steps = WARMUP, STEPS

        def loss_of(x, y):
            return torch.nn.functional.cross_entropy(model(x), y)

    def train(part):
        for x, y in part:
            loss_of(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()

    train(batches[:warmup])
    dist.barrier()
    start = time.perf_counter()
    train(batches[warmup:])
    dist.barrier()
    step_us = (time.perf_counter() - start) * 1e6 / steps
    if dist.get_rank() == 0:
        print(f"step_us {step_us}", flush=True)
