"""Train a causal transformer block with learnable-alpha entmax attention under PyTorch's DistributedDataParallel.

Run: python examples/distributed_torch.py [--steps 150] [--world 2]
     python examples/distributed_torch.py --check-gradients   (one step: DDP's gradients vs one process's)

Task: sequences of random tokens; at every position t >= LAG the model predicts
the token LAG places back, which only attention can fetch.  Model: token and
position embeddings, one pre-norm transformer block whose attention is
``numeric.torch.MultiheadAttention(mapping="entmax", learn_alpha=True)`` (one
alpha per head, learned inside (1, 2)), a linear read-out, and the softmax
Fenchel-Young loss (cross-entropy) from ``numeric.torch.fenchel_young_loss``.

Distribution is PyTorch's own: ``torch.multiprocessing`` starts ``--world``
processes, ``torch.distributed`` joins them over gloo (CPU), and
``DistributedDataParallel`` averages the gradients; every process trains on
its own slice of each batch.  Nothing of regattn knows it is distributed: the
derived backward passes run inside each process and DDP's all-reduce sums them.

On many GPUs the same script runs under ``torchrun --nproc-per-node=N`` with
``backend="nccl"``, the model moved to ``cuda:LOCAL_RANK`` and
``DistributedDataParallel(model, device_ids=[LOCAL_RANK])``: the maps and
attention run on CUDA tensors as they are.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from numeric import torch as rt

VOCAB, LENGTH, LAG, EMBED, HEADS, BATCH = 16, 24, 3, 32, 4, 64


def make_batch(step: int, batch: int = BATCH):
    """The batch of one training step, the same in every process (each takes its own slice)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (batch, LENGTH), generator=g)
    return tokens, tokens[:, : LENGTH - LAG]  # targets: the token LAG places back, at positions LAG...


class Block(nn.Module):
    """Embeddings, one pre-norm transformer block with regattn attention, a read-out."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, EMBED)
        self.positions = nn.Parameter(0.1 * torch.randn(LENGTH, EMBED))
        self.norm1, self.norm2 = nn.LayerNorm(EMBED), nn.LayerNorm(EMBED)
        self.attn = rt.MultiheadAttention(EMBED, HEADS, batch_first=True, mapping="entmax", learn_alpha=True)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 2 * EMBED), nn.GELU(), nn.Linear(2 * EMBED, EMBED))
        self.out = nn.Linear(EMBED, VOCAB)
        self.register_buffer("causal", torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(1))  # True: not allowed

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=self.causal, is_causal=True, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.out(x)


def loss_of(model, tokens, targets):
    logits = model(tokens)[:, LAG:]
    return rt.fenchel_young_loss(logits, targets, mapping="softmax")


def make_model(dtype=torch.float32) -> Block:
    torch.manual_seed(0)  # every process starts from the same weights (DDP also broadcasts rank 0's)
    return Block().to(dtype)


def worker(rank: int, world: int, init_file: str, steps: int, out: str, dtype) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = DistributedDataParallel(make_model(dtype))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        history = []
        for step in range(max(steps, 1)):
            tokens, targets = make_batch(step)
            loss = loss_of(model, tokens[mine], targets[mine])
            opt.zero_grad()
            loss.backward()
            if steps == 0:  # --check-gradients: keep the first step's (all-reduced) gradients
                break
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            history.append(float(total) / world)
        if rank == 0:
            grads = {name: p.grad.detach().clone() for name, p in model.module.named_parameters()}
            alpha = model.module.attn.alpha.detach().clone() if steps else None
            torch.save({"history": history, "grads": grads, "alpha": alpha}, out)
        dist.barrier()  # no process leaves while another still talks to it (gloo aborts a peer that exits early)
        del model, opt  # DDP's reducer (and its communication hooks) goes before the process group it uses
    finally:
        dist.destroy_process_group()


def run(world: int, steps: int, dtype=torch.float32) -> dict:
    """Train under DDP with ``world`` processes (``steps=0``: one backward pass, no update); rank 0's record."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(worker, args=(world, init_file, steps, out, dtype), nprocs=world, join=True)
        return torch.load(out)


def single_process_gradients(dtype=torch.float64) -> dict:
    model = make_model(dtype)
    tokens, targets = make_batch(0)
    loss_of(model, tokens, targets).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--check-gradients", action="store_true")
    args = parser.parse_args(argv)
    if args.check_gradients:
        ddp = run(args.world, 0, torch.float64)["grads"]
        one = single_process_gradients(torch.float64)
        worst = max(float((ddp[k] - one[k]).abs().max() / one[k].abs().max().clamp_min(1e-300)) for k in one)
        print(f"one step, {args.world} processes vs one: {len(one)} parameters, largest relative difference {worst:.2e}")
        return 0
    record = run(args.world, args.steps)
    history = record["history"]
    for step in range(0, len(history), max(1, len(history) // 6)):
        print(f"step {step:4d}  loss {history[step]:.4f}")
    print(f"step {len(history) - 1:4d}  loss {history[-1]:.4f}")
    print("alpha per head:", " ".join(f"{a:.3f}" for a in record["alpha"].flatten().tolist()))
    first, last = sum(history[:10]) / 10, sum(history[-10:]) / 10
    print(f"loss fell from {first:.3f} to {last:.3f} (mean of the first and last 10 steps) over {args.world} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
