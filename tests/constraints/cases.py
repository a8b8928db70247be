"""What the constraint sets' tests share: the maps every set is checked on, attention's inputs, and central
differences of a scalar function in each of its arrays."""

from __future__ import annotations

import numpy as np

#: the maps every set runs on: closed, sort and root thresholds, alpha on either side of 1, a typed map
MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6}), ("entmax", {"alpha": 1.3}),
        ("shannon_gini", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]
#: with a typed map whose link has no closed form (omega'(p) = p + log(1 + p) + p / (1 + p), inverted by Newton
#: steps), for the sets added after the box
TYPED = [*MAPS, ("gini_log1p", {})]
TYPED_IDS = [*IDS, "gini_log1p"]


def qkv(seed=0, L=6, S=6, scale=1.0):
    """``(q, k, v)`` in ``(batch, heads, length, dim)``: ``(2, 2, L, 4)``, ``(2, 2, S, 4)``, ``(2, 2, S, 3)``, and the
    generator they were drawn from."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 2, L, 4)) * scale, rng.standard_normal((2, 2, S, 4)) * scale
    return q, k, rng.standard_normal((2, 2, S, 3)), rng


def central(f, args, h=1e-6) -> list:
    """The gradient of the scalar ``f(*args)`` in each of ``args`` (arrays) by central differences."""
    out = []
    for i, a in enumerate(args):
        g = np.zeros(np.shape(a))
        for j in np.ndindex(g.shape):
            up, down = [np.array(x, dtype=np.float64) for x in args], [np.array(x, dtype=np.float64) for x in args]
            up[i][j] += h
            down[i][j] -= h
            g[j] = (f(*up) - f(*down)) / (2 * h)
        out.append(g)
    return out
