"""Runs every case of tests/torch/test_context_parallel.py on 2 gloo processes and writes their errors as JSON.

``python -m tests.torch._context_parallel_worker OUT.json FOLDER MODULE``: ``FOLDER`` holds the generated typed map
``MODULE``.  ``python -m tests.torch._context_parallel_worker --disagree OUT.json`` runs :data:`DISAGREE` instead: calls
whose arguments differ between the ranks, each rank's exception (type and message) recorded, then one call that
agrees (the group still works).  Each rank compares its output shard and its gradients with one process's
:func:`numeric.torch.attention` on the whole sequence (float64); the key and value gradients each rank gets are
its own positions' (reduce-scattered), a learned parameter's are summed over the ranks first (as
DistributedDataParallel does).  The file maps each case to the largest relative error over both ranks.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
#: (name, mapping, is_causal, layout, grouped): grouped-query keys and values (2 key heads for 4 query heads)
MAPPINGS = ("softmax", "sparsemax", "entmax15", "entmax_alpha_per_head", "typed")
CASES = [(f"{m}-{'causal' if c else 'full'}-{lay}", m, c, lay, False)
         for m in MAPPINGS for c in (False, True) for lay in ("contiguous", "zigzag")]
CASES += [("entmax15-causal-zigzag-grouped", "entmax15", True, "zigzag", True),
          ("callable-causal-contiguous", "callable", True, "contiguous", False),
          ("entmax_alpha_per_head-causal-zigzag-one-block", "entmax_alpha_per_head", True, "zigzag", False),
          ("sparsemax-full-zigzag-box", "sparsemax", False, "zigzag", False),
          ("entmax15-causal-zigzag-box", "entmax15", True, "zigzag", False),
          ("entmax_alpha_per_head-causal-contiguous-box", "entmax_alpha_per_head", True, "contiguous", False)]
#: whole sequence of 28 positions: 14 a rank, zigzag runs of 7; blocks of 4 rows (neither divides the other)
B, H, L, E, EV, BLOCK = 2, 4, 28, 5, 3, 4


def _mapping(name, alpha, typed):
    from numeric.torch import get_map

    if name == "entmax_alpha_per_head":
        return get_map("entmax", alpha=alpha)
    if name == "typed":
        return typed
    if name == "callable":
        return lambda s, dim: torch.softmax(s, dim=dim)
    return name


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


def _case(rank, mapping_name, causal, layout, grouped, typed, one_block, box):
    from numeric.torch import attention
    from numeric.torch.distributed import context_parallel_attention, shard

    gen = torch.Generator().manual_seed(1)
    hk = H // 2 if grouped else H
    q = torch.randn(B, H, L, E, dtype=torch.float64, generator=gen) * 1.5
    k = torch.randn(B, hk, L, E, dtype=torch.float64, generator=gen) * 1.5
    v = torch.randn(B, hk, L, EV, dtype=torch.float64, generator=gen)
    if grouped:  # (B, H_kv, g, L, E) queries against (B, H_kv, 1, S, E) keys: no copy per group
        q, k, v = q.reshape(B, hk, 2, L, E), k.unsqueeze(2), v.unsqueeze(2)
    alpha = torch.tensor([1.2, 1.5, 1.8, 2.5], dtype=torch.float64).reshape(H, 1, 1).requires_grad_()
    learn = mapping_name == "entmax_alpha_per_head" and not grouped
    mapping = _mapping(mapping_name, alpha, typed)

    # the box: a bound per score (rows the queries, columns every key in position order), each row's bounds of the
    # keys it sees summing past 1 (the diagonal's bound is 1 or more), and a total per row below 1
    upper = total = None
    if box:
        upper = 0.15 + 0.5 * torch.rand(B, H, L, L, dtype=torch.float64, generator=gen) + torch.eye(L, dtype=torch.float64)
        upper.requires_grad_()
        total = 0.9
    kw = {} if upper is None else {"upper": upper, "total": total}

    Q, K, V = (x.clone().requires_grad_() for x in (q, k, v))
    ref = attention(Q, K, V, is_causal=causal, mapping=mapping, **kw)
    dout = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    wrt = [Q, K, V] + ([alpha] if learn else []) + ([upper] if box else [])
    grads = torch.autograd.grad(ref, wrt, dout)

    local = [shard(x, rank, WORLD, layout).detach().requires_grad_() for x in (q, k, v)]
    local_kw = {}
    if box:
        local_upper = shard(upper.detach(), rank, WORLD, layout).requires_grad_()
        local_kw = {"upper": local_upper, "total": total}
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = context_parallel_attention(*local, is_causal=causal, mapping=mapping, layout=layout,
                                         block=None if one_block else BLOCK, **local_kw)
    mine = torch.autograd.grad(out, local + ([alpha] if learn else []) + ([local_upper] if box else []),
                               shard(dout, rank, WORLD, layout))
    with torch.no_grad():
        out_ng = context_parallel_attention(*local, is_causal=causal, mapping=mapping, layout=layout, block=BLOCK,
                                            **local_kw)
    errors = {"output": _rel(out, shard(ref, rank, WORLD, layout)), "output_no_grad": _rel(out_ng, out)}
    for name, a, b in zip(("dq", "dk", "dv"), mine[:3], grads[:3]):
        errors[name] = _rel(a, shard(b, rank, WORLD, layout))
    if learn:
        d = mine[3].clone()
        dist.all_reduce(d)
        errors["dalpha"] = _rel(d, grads[3])
    if box:  # this rank's rows of the bounds' gradient
        errors["dupper"] = _rel(mine[-1], shard(grads[-1], rank, WORLD, layout))
    # memory: nothing kept for the backward pass is larger than the local inputs (no gathered sequence)
    errors["saved_over_local"] = max(saved) / max(t.numel() for t in local + list(local_kw.values())[:1])
    return errors


#: (name, rank 0's arguments, rank 1's arguments) of calls that must raise the same error on both ranks
_SAME = {"n": 4, "dtype": torch.float64, "is_causal": False, "layout": "contiguous", "mapping": "entmax15",
         "grad": (True, True, True), "constraints": {}}
DISAGREE = [("lengths", {}, {"n": 6}),
            ("dtypes", {}, {"dtype": torch.float32}),
            ("causality", {}, {"is_causal": True}),
            ("layouts", {}, {"layout": "zigzag"}),
            ("maps", {}, {"mapping": "sparsemax"}),
            ("map-parameters", {"mapping": ("entmax", 1.5)}, {"mapping": ("entmax", 1.25)}),
            ("gradients", {}, {"grad": (True, False, True)}),
            ("zigzag-odd-on-one-rank", {"n": 5, "layout": "zigzag"}, {"n": 6, "layout": "zigzag"}),
            ("zigzag-odd-on-both", {"n": 5, "layout": "zigzag"}, {"n": 5, "layout": "zigzag"}),
            ("invalid-on-one-rank", {}, {"mapping": "no_such_map"}),
            ("constraint-keywords", {}, {"constraints": {"upper": 0.9}})]


def _disagree_call(rank, mine):
    from numeric.torch import get_map
    from numeric.torch.distributed import context_parallel_attention

    a = {**_SAME, **mine}
    mapping = get_map(a["mapping"][0], alpha=a["mapping"][1]) if isinstance(a["mapping"], tuple) else a["mapping"]
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(2, 3, a["n"], 4, dtype=a["dtype"], generator=gen).requires_grad_(g) for g in a["grad"])
    out = context_parallel_attention(q, k, v, is_causal=a["is_causal"], layout=a["layout"], mapping=mapping,
                                     **a["constraints"])
    out.sum().backward()
    return out


def _run_disagree(rank, init, out):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    results = {}
    for name, *args in DISAGREE:
        try:
            _disagree_call(rank, args[rank])
            got = {"type": None, "message": None}
        except Exception as e:  # noqa: BLE001 - the test reads which exception each rank raised
            got = {"type": type(e).__name__, "message": str(e)}
        both = [None] * WORLD
        dist.all_gather_object(both, got)
        results[name] = both
    results["agreeing-call-after"] = _disagree_call(rank, {}).shape[-2]
    # a callable whose repr holds its address (another in each process) is the same map on every rank
    results["agreeing-callable-object"] = _disagree_call(rank, {"mapping": functools.partial(torch.softmax)}).shape[-2]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    # (a rank that destroys the group while another still writes can abort in gloo's teardown, 'terminate called
    # without an active exception': every rank waits for the others first, as examples/distributed_torch.py does)
    dist.barrier()
    dist.destroy_process_group()


def _run(rank, init, out, folder, module):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    sys.path.insert(0, folder)
    typed = __import__(module)
    results = {}
    for name, mapping_name, causal, layout, grouped in CASES:
        errors = _case(rank, mapping_name, causal, layout, grouped, typed, name.endswith("one-block"),
                       name.endswith("-box"))
        both = [None] * WORLD
        dist.all_gather_object(both, errors)
        results[name] = {k: max(e[k] for e in both) for k in errors}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    # (a rank that destroys the group while another still writes can abort in gloo's teardown, 'terminate called
    # without an active exception': every rank waits for the others first, as examples/distributed_torch.py does)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[1] == "--disagree":
            mp.spawn(_run_disagree, args=(os.path.join(tmp, "init"), sys.argv[2]), nprocs=WORLD)
        else:
            out, folder, module = sys.argv[1:4]
            mp.spawn(_run, args=(os.path.join(tmp, "init"), out, folder, module), nprocs=WORLD)
