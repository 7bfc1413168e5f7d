"""The GPT example (examples/gpt) in raw PyTorch: the same network, initialisation, data, sampling,
optimiser, schedule, clipping and bf16 autocast, for the side-by-side run of scripts/bench_gpt.sh
(docs/gpt-example.md). It reads the train.bin / val.bin that `gpt prepare` writes (llm.c's layout)
and prints one line per validation, `step N val_loss X`, then `tokens/s Y`.

    python bench/python/gpt_reference.py --data DIR [--max-steps 1500] [--val-every 250] [--seed 0]
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 256, 128, 128, 4, 4
LR, MIN_LR, WEIGHT_DECAY, BETA2, WARMUP = 2e-3, 2e-4, 0.1, 0.99, 100


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, w // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        y = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w))
        return y + self.fc2(F.gelu(self.fc1(self.ln2(y))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Parameter(torch.empty(CONTEXT, WIDTH))
        for i in range(LAYERS):
            self.add_module(f"block{i}", Block())
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)
        residual_std = 0.02 / math.sqrt(2 * LAYERS)  # as examples/gpt/model.hpp's initialise()
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln") or ".ln" in name:
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, residual_std if name.endswith(("proj.weight", "fc2.weight")) else 0.02)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions[: ids.shape[1]]
        for i in range(LAYERS):
            x = getattr(self, f"block{i}")(x)
        return self.head(self.ln(x))


def tokens_of(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not an llm.c uint16 token file"
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64))


def windows(tokens, starts):
    offsets = starts[:, None] + torch.arange(CONTEXT + 1)
    rows = tokens[offsets]
    return rows[:, :-1], rows[:, 1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--val-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    train, val = tokens_of(f"{args.data}/train.bin"), tokens_of(f"{args.data}/val.bin")
    model = Gpt()
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "positions"]
    kept = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n != "positions")]
    adamw = torch.optim.AdamW([{"params": decayed, "weight_decay": WEIGHT_DECAY}, {"params": kept, "weight_decay": 0.0}],
                              lr=LR, betas=(0.9, BETA2), fused=True)
    warmup = min(WARMUP, args.max_steps // 10 + 1)
    schedule = torch.optim.lr_scheduler.SequentialLR(adamw, [
        torch.optim.lr_scheduler.LinearLR(adamw, 1.0 / warmup, 1.0, warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(adamw, args.max_steps - warmup, MIN_LR)], [warmup])

    # Every position starts a training window; an epoch is a seeded permutation of them (the example's
    # shuffled stride-1 TokenDataset). Validation: disjoint windows, the loss weighted by batch size.
    n_train, n_val = len(train) - CONTEXT, (len(val) - 1) // CONTEXT
    generator = torch.Generator().manual_seed(args.seed)
    order, cursor, step, trained_seconds = torch.randperm(n_train, generator=generator), 0, 0, 0.0

    def validate():
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for first in range(0, n_val, args.batch_size):
                x, y = windows(val, torch.arange(first, min(first + args.batch_size, n_val)) * CONTEXT)
                total += F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()).item() * len(x)
                count += len(x)
        model.train()
        return total / count

    print(f"step 0 val_loss {validate():.4f}", flush=True)
    while step < args.max_steps:
        if cursor + args.batch_size > n_train:
            order, cursor = torch.randperm(n_train, generator=generator), 0
        started = time.perf_counter()
        x, y = windows(train, order[cursor:cursor + args.batch_size])
        cursor += args.batch_size
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        adamw.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        adamw.step()
        schedule.step()
        step += 1
        trained_seconds += time.perf_counter() - started
        if step % args.val_every == 0 or step == args.max_steps:
            print(f"step {step} val_loss {validate():.4f} train_loss {loss.item():.4f}", flush=True)
    print(f"tokens/s {step * args.batch_size * CONTEXT / trained_seconds:.0f}")


if __name__ == "__main__":
    main()
