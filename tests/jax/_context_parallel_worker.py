"""The worker of tests/jax/test_context_parallel.py: context-parallel attention over 2 host devices against one device.

Run by the test in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (read once, when JAX
starts): ``python _context_parallel_worker.py FOLDER`` with ``FOLDER`` holding the generated module
``cp_gini_log1p``.  Every case of :data:`CASES` runs in this one process (JAX's start and the compilations
dominate) and prints one JSON line: the largest differences, relative to the largest magnitude, between
:func:`numeric.jax.context_parallel_attention` (the arrays laid out, the output laid back) and
:func:`numeric.jax.attention` on the arrays in natural order, in float64, of the output and of the gradients of
``sum(out * W)`` in ``query``, ``key``, ``value`` (and ``alpha`` where the map's alpha per head is an argument),
and the output's sharding; then the per-device shapes of the residuals the backward pass keeps (case
``residuals``) and the errors of lengths the layouts cannot cut over 2 devices (case ``errors``).  Importing this module runs nothing (pytest's doctest collection imports it).
"""

from __future__ import annotations

#: name: (mapping, is_causal, layout, block_size[, box]); mapping "entmax_alpha" is entmax with alpha per head
#: (N, 1, 1) differentiated, "cp_gini_log1p" the generated module.  Block size 4 with T / P = 6 query rows a device
#: runs the blocked loop with a padded last block; None runs one block.  box: the box constraint with a bound per
#: score (B, N, T, T), differentiated, and total 0.9.
CASES = {
    "softmax-causal-zigzag": ("softmax", True, "zigzag", 4),
    "softmax-contiguous-one-block": ("softmax", False, "contiguous", None),
    "sparsemax-causal-contiguous": ("sparsemax", True, "contiguous", 4),
    "entmax15-zigzag": ("entmax15", False, "zigzag", 4),
    "entmax-alpha-causal-zigzag": ("entmax_alpha", True, "zigzag", 4),
    "entmax-alpha-contiguous-one-block": ("entmax_alpha", False, "contiguous", None),
    "gini-log1p-causal-contiguous": ("cp_gini_log1p", True, "contiguous", 4),
    "gini-log1p-causal-zigzag": ("cp_gini_log1p", True, "zigzag", 4),
    "sparsemax-box-zigzag": ("sparsemax", False, "zigzag", 4, True),
    "entmax15-box-causal-zigzag": ("entmax15", True, "zigzag", 4, True),
    "entmax-alpha-box-causal-contiguous-one-block": ("entmax_alpha", True, "contiguous", None, True),
}

#: (B, T, N, K, H, Hv) of every case: grouped heads (K < N), T = 12 over P = 2 devices (zigzag chunks of 3).
SHAPE = (2, 12, 4, 2, 3, 2)
DEVICES = 2
AXIS = "seq"


def _error(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def run_case(name, mesh, arrays, references: dict) -> dict:
    """One case's line; ``references`` caches the single-device results by (mapping, is_causal)."""
    import importlib

    import jax
    import jax.numpy as jnp
    import numpy as np

    import numeric.jax as rj

    mapping, causal, layout, block_size, *box = CASES[name]
    q, k, v, w, alpha, upper = arrays
    learned = mapping == "entmax_alpha"
    box = bool(box and box[0])

    def the_map(a):
        if learned:
            return rj.JaxMap("entmax", alpha=a)
        return importlib.import_module(mapping) if mapping.startswith("cp_") else mapping

    def reference(q, k, v, a, u):
        out = rj.attention(q, k, v, is_causal=causal, mapping=the_map(a), **({"upper": u, "total": 0.9} if box else {}))
        return jnp.sum(out * w), out

    def parallel(q, k, v, a, u):
        lay = lambda x, axis=1: rj.shard_layout(x, DEVICES, layout, axis)  # noqa: E731
        # the bounds' query and key axes in the layout's order, as the queries' and keys' are
        kw = {"upper": lay(lay(u, 2), 3), "total": 0.9} if box else {}
        out = rj.context_parallel_attention(lay(q), lay(k), lay(v), mesh=mesh, axis_name=AXIS, is_causal=causal,
                                            mapping=the_map(a), layout=layout, block_size=block_size, **kw)
        return jnp.sum(rj.unshard_layout(out, DEVICES, layout) * w), out  # (out: laid out, as it comes)

    argnums = (0, 1, 2) + ((3,) if learned else ()) + ((4,) if box else ())
    if (mapping, causal, box) not in references:
        references[mapping, causal, box] = jax.jit(jax.value_and_grad(reference, argnums, has_aux=True))(
            q, k, v, alpha, upper)
    (_, ref_out), ref_grads = references[mapping, causal, box]
    (_, out), grads = jax.jit(jax.value_and_grad(parallel, argnums, has_aux=True))(q, k, v, alpha, upper)
    spec = out.sharding.spec if isinstance(out.sharding, jax.sharding.NamedSharding) else None
    result = {"case": name, "out": _error(rj.unshard_layout(out, DEVICES, layout), ref_out),
              "sharding": None if spec is None else [None if s is None else str(s) for s in spec],
              "shards": sorted({tuple(s.data.shape) for s in out.addressable_shards}),
              "finite": bool(np.all(np.isfinite(np.asarray(out))))}
    for g, r, n in zip(grads, ref_grads, ("dq", "dk", "dv") + (("dalpha",) if learned else ()) + (("dupper",) if box else ())):
        result[n] = _error(g, r)
    return result


def residuals(mesh, arrays) -> dict:
    """The per-device shapes of what the backward pass keeps (the leaves of ``jax.vjp``'s function) for inputs
    sharded along T, causal entmax with alpha per head, zigzag, in blocks and in one block."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import numeric.jax as rj

    q, k, v, _, alpha, _ = arrays
    q, k, v = (jax.device_put(x, NamedSharding(mesh, P(None, AXIS))) for x in (q, k, v))
    shapes = {}
    for block_size in (4, None):
        def f(q, k, v, a):
            return rj.context_parallel_attention(q, k, v, mesh=mesh, axis_name=AXIS, is_causal=True, layout="zigzag",
                                                 mapping=rj.JaxMap("entmax", alpha=a), block_size=block_size)

        _, vjp = jax.vjp(jax.jit(f), q, k, v, alpha)
        shapes[str(block_size)] = [list(leaf.addressable_shards[0].data.shape) for leaf in jax.tree_util.tree_leaves(vjp)]
    return {"case": "residuals", "shapes": shapes}


def errors(mesh) -> dict:
    """The messages of the lengths the layouts cannot cut over the 2 devices (validated before any tracing)."""
    import jax.numpy as jnp

    import numeric.jax as rj

    messages = {}
    for layout, T in (("contiguous", 5), ("zigzag", 6)):
        x = jnp.zeros((1, T, 1, 1))
        try:
            rj.context_parallel_attention(x, x, x, mesh=mesh, axis_name=AXIS, layout=layout)
        except ValueError as exc:
            messages[layout] = str(exc)
    return {"case": "errors", "messages": messages}


def main(folder: str) -> None:
    import json
    import sys

    sys.path.insert(0, folder)

    import jax
    import numpy as np
    from jax.sharding import Mesh

    assert len(jax.devices()) >= DEVICES, jax.devices()
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), (AXIS,))
    B, T, N, K, H, Hv = SHAPE
    with jax.enable_x64(True):
        rng = np.random.default_rng(26)
        arrays = (rng.normal(size=(B, T, N, H)), rng.normal(size=(B, T, K, H)), rng.normal(size=(B, T, K, Hv)),
                  rng.normal(size=(B, T, N, Hv)), 1.1 + 0.8 * rng.random((N, 1, 1)),
                  # bounds per score whose visible ones sum past 1 in every row (the diagonal's is over 1)
                  0.15 + 0.5 * rng.random((B, N, T, T)) + np.eye(T))
        arrays = tuple(jax.numpy.asarray(a, jax.numpy.float64) for a in arrays)
        references = {}
        for name in CASES:
            print(json.dumps(run_case(name, mesh, arrays, references)), flush=True)
        print(json.dumps(residuals(mesh, arrays)), flush=True)
        print(json.dumps(errors(mesh)), flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
