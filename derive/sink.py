"""The ground truth with a sink: ``p`` = the first ``n`` coordinates of ``argmax_{p' in simplex_{n+1}} <[s, b], p'> -
sum_i omega(p'_i)``, the sink's coordinate dropped.

The set of ``p`` is ``p >= 0``, ``sum p <= 1``, the slack ``p_b = 1 - sum p`` being the sink's weight; the threshold
solves ``sum_i g_+(s_i - tau) + g_+(b - tau) = 1``.  The Jacobian in ``(s, b)`` is the simplex's on ``[s, b]``,
``diag(w) - w w^T / sum w`` with the sink's weight ``w_b = 1 / omega''(p_b)`` in ``w`` and its sum; the gradient of
``<v, p>`` in ``b`` is its last row against ``[v, 0]``.  The Fenchel-Young loss is the simplex's on ``[s, b]``
against ``[y, 1 - sum y]``, with the gradients ``p - y`` and ``p_b - (1 - sum y)``.

Each is the plain reference (:mod:`derive.reference`) on the scores with the sink appended: the definition itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mpmath

from . import reference
from .reference import GUARD_DIGITS, to_mp_vector

if TYPE_CHECKING:
    from .derivation import Derivation

__all__ = ["solve_sink", "sink_jacobians", "sink_loss", "sink_loss_gradients"]


def _extended(scores, sink):
    return to_mp_vector(scores) + [mpmath.mpf(sink) if not isinstance(sink, mpmath.mpf) else sink]


def solve_sink(dv: Derivation, scores: Any, sink: Any, digits: int = 50, **params: Any) -> list:
    """``p`` with the sink ``b`` (a number) for one score vector; the sink's weight is ``1 - sum p``."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        return reference.evaluate(dv, _extended(scores, sink), digits, **params)[:-1]


def sink_jacobians(dv: Derivation, scores: Any, sink: Any, digits: int = 50, **params: Any) -> dict:
    """``{"scores": dp/ds (n x n), "sink": dp/db (n)}``: the extended Jacobian's first ``n`` rows."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        full = reference.jacobian(dv, _extended(scores, sink), digits, **params)
        n = len(full) - 1
        return {"scores": [row[:n] for row in full[:n]], "sink": [full[a][n] for a in range(n)]}


def _target(target):
    ys = to_mp_vector(target)
    rest = 1 - mpmath.fsum(ys)
    if any(t < 0 for t in ys) or rest < -mpmath.mpf(10) ** -12:
        raise ValueError(f"target must be non-negative and sum to at most 1, got sum {mpmath.nstr(1 - rest, 17)}")
    return ys + [max(rest, mpmath.mpf(0))]


def sink_loss(dv: Derivation, scores: Any, target: Any, sink: Any, digits: int = 50, **params: Any):
    """The Fenchel-Young loss with the sink: the simplex's on ``[s, b]`` against ``[y, 1 - sum y]``."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        return reference.loss(dv, _extended(scores, sink), _target(target), digits, **params)


def sink_loss_gradients(dv: Derivation, scores: Any, target: Any, sink: Any, digits: int = 50,
                        **params: Any) -> dict:
    """``{"scores": p - y, "sink": p_b - (1 - sum y)}``."""
    with mpmath.workdps(digits + GUARD_DIGITS):
        p = reference.evaluate(dv, _extended(scores, sink), digits, **params)
        ys = _target(target)
        return {"scores": [q - t for q, t in zip(p[:-1], ys[:-1])], "sink": p[-1] - ys[-1]}
