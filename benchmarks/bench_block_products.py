"""Block products of the fused Triton attention kernels, counted in Triton's interpreter, per map.

Run: python benchmarks/bench_block_products.py [--length 256] [--dim 64] [--maps softmax sparsemax ...] [--inference-only]
     [--upper U | --sink B] [--softcap C] [--window W]

On a GPU the fused kernels' cost is their matrix products over (query block, key
block) pairs: every pass over the key blocks recomputes ``Q K^T``.  This script
runs the kernels on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``,
16-wide blocks, each row's 64 largest scores kept as on a GPU: ``numeric.torch.fused.KEEP``), counts the calls
of the kernels' product (``block_product``: ``Q K^T``,
``P V``, ``dO V^T``, ``dS K``, ``dS^T Q``, ``P^T dO``), and reports them per
(query block, key block) pair, forward and backward, for random normal q, k, v
(one batch, one head, L = S, not causal).  Softmax's forward is FlashAttention's
one pass: 2 products per pair.  The forward is counted twice: for inference (no
gradient) and for training, where it also accumulates ``W V`` for the backward
(one product more, except for softmax, whose ``W V`` is the output).  The typed maps (links with no closed form) are
generated as ``regattn generate --expr`` would (``benchmarks/_typed.py``).  ``--upper U`` bounds every
weight by ``U`` (``attention(..., upper=U)``: the bounded kernels, one pass over the keys per Newton round of the
threshold; the ratio column stays relative to unbounded softmax).  ``--sink B`` gives each row a sink of score ``B``
(``SET='sink'``), ``--softcap C`` caps the scores, ``--window W`` is a causal sliding window: the counts are then per
pair the plan visits (a key block some row of the query block sees; :class:`numeric.plan.Plan`), and the pairs
column says how many of the ``(L / 16)^2`` that is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

MAPS = {"softmax": {}, "sparsemax": {}, "entmax15": {}, "entmax-1.3": {"alpha": 1.3}, "plogp_cube": {},
        "gini_log1p": {}, "sigmoid": {}, "relu": {}}  # (the last two without a sum: no threshold)


def count(mapping, length: int, dim: int, seed: int = 0, inference_only: bool = False, upper=None, **keywords) -> dict:
    """``{"inference": forward products per pair without gradients, "forward": with them, "backward": ...,
    "seconds": interpreter time, "pairs": the pairs visited}`` for one map (``forward`` and ``backward`` NaN where
    ``inference_only``); ``upper``: a bound on every weight (``None``: none); ``keywords``: attention's others
    (``sink``, ``softcap``, ``window``)."""
    import torch

    from numeric.kernels import triton_attention as kernels
    from numeric.torch import attention

    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, 1, length, dim, generator=g) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    import importlib

    calls = [0]
    modules = [importlib.import_module(name) for name in kernels.PRODUCT_MODULES]  # (forward and backward kernels)
    product = kernels.block_product

    def counted(*args):
        calls[0] += 1
        return product(*args)

    for module in modules:
        module.block_product = counted
    try:
        start = time.perf_counter()
        with torch.no_grad():
            attention(q, k, v, mapping=mapping, backend="triton", upper=upper, **keywords)
        inference = calls[0]
        forward = float("nan")
        calls[0] = 0
        if not inference_only:
            out = attention(*leaves, mapping=mapping, backend="triton", upper=upper, **keywords)
            forward = calls[0]
            torch.autograd.grad(out, leaves, do)
        seconds = time.perf_counter() - start
    finally:
        for module in modules:
            module.block_product = product
    from numeric.plan import Plan
    from numeric.torch.fused import BLOCK

    size = BLOCK["cpu"]
    plan = Plan(length, length, size, window=keywords.get("window"))
    pairs = sum(-(-b.hi // size) - b.lo // size for b in plan)
    return {"inference": inference / pairs, "forward": forward / pairs, "backward": (calls[0] - forward) / pairs,
            "seconds": seconds, "pairs": pairs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--maps", nargs="+", default=list(MAPS))
    parser.add_argument("--inference-only", action="store_true",
                        help="count the forward without gradients only (about half the time)")
    parser.add_argument("--upper", type=float, default=None,
                        help="bound every weight by this (the bounded kernels); at least 1/length")
    parser.add_argument("--sink", type=float, default=None, help="a sink of this score in every row")
    parser.add_argument("--softcap", type=float, default=None, help="cap the scores at this")
    parser.add_argument("--window", type=int, default=None, help="a causal sliding window of this many keys")
    args = parser.parse_args(argv)
    import triton

    if not triton.knobs.runtime.interpret:
        raise SystemExit("set TRITON_INTERPRET=1 before Triton is imported")
    from _typed import TYPED, typed_modules

    from numeric.torch import get_map

    typed = typed_modules() if set(args.maps) & set(TYPED) else {}
    keywords = {n: getattr(args, n) for n in ("sink", "softcap", "window") if getattr(args, n) is not None}
    bounded = "" if args.upper is None else f", every weight at most {args.upper:g}"
    extra = "".join(f", {n} {v:g}" for n, v in keywords.items())
    print(f"block products per (query block, key block) pair visited, L = S = {args.length}, E = {args.dim}, "
          f"random normal q, k, v, {'causal' if 'window' in keywords else 'not causal'}{bounded}{extra}")
    print(f"{'map':<12} {'inference':>9} {'forward':>8} {'backward':>9} {'x softmax fwd':>14} {'pairs':>6} {'s':>6}")
    base = count(get_map("softmax"), args.length, args.dim, inference_only=True)["inference"]
    for name in args.maps:
        params = MAPS[name]
        mapping = get_map(typed[name]) if name in typed else get_map(name.split("-")[0], **params)
        got = count(mapping, args.length, args.dim, inference_only=args.inference_only, upper=args.upper, **keywords)
        ratio = f"{got['inference'] / base:.2f}" if base else "-"
        print(f"{name:<12} {got['inference']:>9.2f} {got['forward']:>8.2f} {got['backward']:>9.2f} {ratio:>14} "
              f"{got['pairs']:>6} {got['seconds']:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
