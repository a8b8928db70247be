"""Train a causal model whose sequences are sharded over processes: context-parallel entmax attention.

Run: python examples/context_parallel_torch.py [--steps 120] [--world 2] [--layout zigzag]
     python examples/context_parallel_torch.py --check-gradients   (one step: the shards' gradients vs one process's)

Task: sequences of random tokens; at every position t >= LAG the model predicts
the token LAG places back, which only attention can fetch, and for the first
positions of a rank's shard it has to fetch it from another rank's shard.
Model: token and position embeddings, one pre-norm transformer block whose
attention is 1.5-entmax-like with an alpha per head learned inside (1, 2)
(:func:`numeric.torch.get_map` with ``alpha`` a tensor), a linear read-out,
and the softmax Fenchel-Young loss (cross-entropy).

Every process holds the whole batch but only its shard of each sequence
(``numeric.torch.distributed.shard``, ``--layout`` contiguous or zigzag); the
attention is ``context_parallel_attention``, which all-gathers the keys and
values of the sequence over the process group and sends the key and value
gradients back to the ranks that hold them.  The weights are replicated:
``DistributedDataParallel`` sums their gradients (each process's loss is its
positions' share of the mean over all positions).  Attention runs over its own
process group, DDP over the default one.

On many GPUs the same script runs with ``backend="nccl"`` (one process per GPU,
``torchrun``) and the tensors on ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from numeric import torch as rt
from numeric.torch.distributed import context_parallel_attention, positions, shard

VOCAB, LENGTH, LAG, EMBED, HEADS, BATCH = 16, 48, 3, 32, 4, 16


def make_batch(step: int):
    """``(tokens, targets)`` of one training step, the same in every process (each takes its shard of the
    positions): the target at position t is the token at t - LAG, none (-1) before LAG."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    return tokens, torch.cat([torch.full((BATCH, LAG), -1), tokens[:, :LENGTH - LAG]], dim=1)


class Block(nn.Module):
    """Embeddings, one pre-norm transformer block with context-parallel attention, a read-out."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.place = nn.Embedding(LENGTH, EMBED)  # looked up by global position: a shard's rows find theirs
        self.pre_attention, self.pre_mlp = nn.LayerNorm(EMBED), nn.LayerNorm(EMBED)
        self.qkv, self.proj = nn.Linear(EMBED, 3 * EMBED), nn.Linear(EMBED, EMBED)
        self.alpha_logit = nn.Parameter(torch.zeros(HEADS, 1, 1))  # alpha = 1 + sigmoid(logit), 1.5 at the start
        self.mlp = nn.Sequential(nn.Linear(EMBED, 2 * EMBED), nn.GELU(), nn.Linear(2 * EMBED, EMBED))
        self.out = nn.Linear(EMBED, VOCAB)

    @property
    def alpha(self):
        return 1 + torch.sigmoid(self.alpha_logit)

    def forward(self, tokens, where, attend):
        """Logits of the positions ``where`` (global indices) of ``tokens``; ``attend(q, k, v, mapping)``."""
        x = self.embed(tokens) + self.place(where)
        n = x.shape[1]
        q, k, v = self.qkv(self.pre_attention(x)).reshape(BATCH, n, 3, HEADS, EMBED // HEADS).permute(2, 0, 3, 1, 4)
        a = attend(q, k, v, rt.get_map("entmax", alpha=self.alpha))  # (B, H, n, D)
        x = x + self.proj(a.transpose(1, 2).reshape(BATCH, n, EMBED))
        x = x + self.mlp(self.pre_mlp(x))
        return self.out(x)


def loss_of(model, tokens, targets, where, attend):
    """The loss of the positions ``where``, as their share of the mean over every position with a target."""
    logits = model(tokens, where, attend)
    has = where >= LAG
    total = rt.fenchel_young_loss(logits[:, has], targets[:, has], mapping="softmax", reduction="sum")
    return total / (BATCH * (LENGTH - LAG))


def make_model(dtype=torch.float32) -> Block:
    torch.manual_seed(0)  # every process starts from the same weights (DDP also broadcasts rank 0's)
    return Block().to(dtype)


def worker(rank: int, world: int, init_file: str, steps: int, layout: str, out: str, dtype) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cp = dist.new_group()  # the attention's collectives on their own group, DDP's on the default one
        model = DistributedDataParallel(make_model(dtype))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        where = positions(LENGTH // world, rank, world, layout)

        def attend(q, k, v, mapping):
            return context_parallel_attention(q, k, v, group=cp, is_causal=True, mapping=mapping, layout=layout)

        history = []
        for step in range(max(steps, 1)):
            tokens, targets = (shard(t, rank, world, layout, dim=1) for t in make_batch(step))
            loss = loss_of(model, tokens, targets, where, attend)
            opt.zero_grad()
            loss.backward()
            if steps == 0:  # --check-gradients: keep the first step's gradients (DDP's mean over the processes)
                break
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            history.append(float(total))
        if rank == 0:
            # DDP averages over the processes; each loss is a share of the sum, so the sum is `world` times that
            grads = {name: world * p.grad.detach() for name, p in model.module.named_parameters()}
            torch.save({"history": history, "grads": grads, "alpha": model.module.alpha.detach().flatten()}, out)
        dist.barrier()  # no process leaves while another still talks to it
        del model, opt
    finally:
        dist.destroy_process_group()


def run(world: int, steps: int, layout: str, dtype=torch.float32) -> dict:
    """Train with ``world`` processes (``steps=0``: one backward pass, no update); rank 0's record."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(worker, args=(world, init_file, steps, layout, out, dtype), nprocs=world, join=True)
        return torch.load(out)


def single_process_gradients(dtype=torch.float64) -> dict:
    model = make_model(dtype)

    def attend(q, k, v, mapping):
        return rt.attention(q, k, v, is_causal=True, mapping=mapping)

    loss_of(model, *make_batch(0), torch.arange(LENGTH), attend).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default="zigzag")
    parser.add_argument("--check-gradients", action="store_true")
    args = parser.parse_args(argv)
    if args.check_gradients:
        cp = run(args.world, 0, args.layout, torch.float64)["grads"]
        one = single_process_gradients(torch.float64)
        worst = max(float((cp[k] - one[k]).abs().max() / one[k].abs().max().clamp_min(1e-300)) for k in one)
        print(f"one step, sequences sharded over {args.world} processes ({args.layout}) vs one: {len(one)} parameters, "
              f"largest relative difference {worst:.2e}")
        return 0
    record = run(args.world, args.steps, args.layout)
    history = record["history"]
    for step in range(0, len(history), max(1, len(history) // 6)):
        print(f"step {step:4d}  loss {history[step]:.4f}")
    print(f"step {len(history) - 1:4d}  loss {history[-1]:.4f}")
    print("alpha per head:", " ".join(f"{a:.3f}" for a in record["alpha"].tolist()))
    first, last = sum(history[:10]) / 10, sum(history[-10:]) / 10
    print(f"loss fell from {first:.3f} to {last:.3f} (mean of the first and last 10 steps; chance is "
          f"log({VOCAB}) = {math.log(VOCAB):.2f}) with each sequence sharded over {args.world} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
