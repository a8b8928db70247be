"""Sinks: ``p`` = the first ``n`` coordinates of the map over ``[s, b]``, the sink's column dropped (``sink=b``),
every map (:mod:`derive.sink`, the reference).

The set is ``p >= 0``, ``sum p <= 1``, its slack ``1 - sum p`` the sink's weight ``p_b``, priced at the score
``b`` and regularized by ``omega`` as any coordinate:

* the threshold solves ``sum_i g_+(s_i - tau) + g_+(b - tau) = 1`` (the simplex's solve on ``[s, b]``);
* the Jacobian in ``(s, b)`` is the simplex's on ``[s, b]``, ``J = diag(w) - w w^T / sum w`` with the sink's weight
  ``w_b = 1 / omega''(p_b)`` in ``w`` and ``sum w``; the gradient in ``b`` is its last row;
* the Fenchel-Young loss is the simplex's on ``[s, b]`` against ``[y, 1 - sum y]``: its gradient is ``p - y`` in
  the scores and ``p_b - (1 - sum y)`` in the sink.

``p_b`` is recovered from ``p`` and the scores (the threshold at the largest ``p_i``, ``tau = s_k - omega'(p_k)``,
then ``p_b = g_+(b - tau)``), which keeps a small ``p_b`` and a sparse map's exact zero (``1 - sum p`` would carry
the sum's rounding, a spurious support entry of sparsemax's): the derivatives need the scores.  A sparse map can put all the mass on the sink: a row of
scores that attends to nothing.  ``b = -inf`` is the map without a sink; softmax with ``b = 0`` is softmax1.
"""

from __future__ import annotations

import math

from ..core import derivatives, rules
from ..core.halley import clipped_link
from ..core.ops import uncat
from .base import ConstraintSet, lay_out
from .box import box_ceiling
from .table import register

__all__ = ["Sink", "SINK", "sink_weight"]


def _threshold(ops, r, p, b, x, top):
    """``tau`` per row at the map's ``p`` (whose row maxima are ``top``) of the scores ``x`` with the sink ``b``:
    ``s_k - omega'(p_k)`` at the largest ``p_k``, ``b - omega'(1)`` in a row where every ``p_i = 0`` (NaN in a NaN
    row, ``inf`` in a fully masked one with a masked sink)."""
    at = (p >= top) & (p > 0)
    count = ops.row_sum(ops.float_(at))
    some = count > 0
    tau = ops.where(some, ops.row_sum(ops.where(at, x - r.omega_prime(ops.where(at, p, 1)), 0))
                    / ops.where(some, count, 1), b - r.omega_prime(ops.full(top, 1.0)))
    return tau


def sink_weight(ops, r, p, b, x):
    """The sink's weight ``p_b`` per row (``(rows, 1)``) at the map's ``p`` of the scores ``x`` with the sink ``b``
    (``(rows, 1)``): ``g_+(b - tau)``, ``tau = s_k - omega'(p_k)`` at the largest ``p_k`` (:func:`_threshold`; 1 in
    a row where every ``p_i = 0``)."""
    top = ops.row_max(p)
    some = top > 0
    # (a row where every p_i = 0 has tau = b - omega'(1); the link is evaluated off the support at the largest
    # score on it, or at b, values inside its domain, which keeps NaN out of the derivatives of either branch)
    tau = _threshold(ops, r, p, b, x, top)
    peak = ops.where(some, ops.row_max(ops.where(p > 0, x, -math.inf)), b)
    g, _ = clipped_link(ops, r, b, tau, r.clip(), peak=peak, ceiling=box_ceiling(ops, r, tau))
    return ops.where(ops.isnan(top), math.nan, g)


def _rest(ops, q):
    """``max(0, 1 - sum q)`` per row."""
    rest = 1 - ops.row_sum(q)
    return ops.where(rest > 0, rest, 0)


class Sink(ConstraintSet):
    """A sink per row (see the module's docstring): ``sink=``, a number or an array broadcasting to the scores with
    size 1 along the map's axis; ``None`` (the default) for none."""

    name = "sink"
    keywords = {"sink": None}
    appends = "sink"
    jacobian_scores = True
    fused = "column"  # (the kernels' hook: one more score per row, without a value)

    def fused_arguments(self, values: dict) -> dict:
        return {"column": values["sink"]}

    def asks(self, values: dict) -> bool:
        return values["sink"] is not None

    def rows(self, xp, arrays, x, values: dict, axis: int, word: str = "axis") -> tuple:
        return (lay_out(xp, arrays, x, values["sink"], "sink", False, axis, word),)

    def solve(self, ops, r, x, b):
        if r.module.THRESHOLD == "closed":  # (softmax: the sink's term joins the row sums, no copy of the rows)
            return rules.closed_with(ops, r, x, b)
        p, tau = rules.solve(ops, r, ops.cat(x, b))
        return uncat(p, x.shape[-1])[0], tau

    def _weights(self, ops, r, p, b, x, at_zero):
        """``(w, w_b)``: the weights of the scores and of the sink."""
        return derivatives.weights(ops, r, p, at_zero), derivatives.weights(ops, r, sink_weight(ops, r, p, b, x), at_zero)

    def vjp(self, ops, r, p, v, b, at_zero=None, x=None):
        # (the simplex's on [s, b] against [v, 0], the rows not concatenated: the sink's own is -w_b mean)
        w, wb = self._weights(ops, r, p, b, x, at_zero)
        js, mean = derivatives.centred(ops, w, v, (wb, 0))
        return js, (-wb * mean,)

    def jvp(self, ops, r, p, dx, tangents: tuple, b, at_zero=None, x=None):
        (db,) = tangents
        w, wb = self._weights(ops, r, p, b, x, at_zero)
        return derivatives.centred(ops, w, dx + 0 * p, (wb, db + 0 * b))[0]

    def param_directions(self, ops, r, p, name: str, b, x=None) -> tuple:
        # (the sink is a coordinate of the map: a parameter moves its tangent as any score's, -omega'_q(p_b) dq)
        pb = sink_weight(ops, r, p, b, x)
        pos = ops.support(pb)
        return (getattr(r, f"omega_prime_d_{name}")(pb + (1 - pos)) * pos,)

    def loss_terms(self, ops, r, x, p, y, b):
        # (the sink's p_b as 1 - sum p, the value's rounding: a function of p alone, which the envelope theorem's
        # derivatives in the map's parameters hold fixed)
        return derivatives.omega_terms(ops, r, ops.cat(x, b), ops.cat(p, _rest(ops, p)), ops.cat(y, _rest(ops, y)))

    def loss_gradients(self, ops, r, x, tau, b, p=None, y=None) -> tuple:
        return (sink_weight(ops, r, p, b, x) - _rest(ops, y),)

    def check_target(self, xp, target, rows: tuple, slack: float, word: str, axis: int):
        total = target.sum(axis=-1)
        if bool((target < 0).any()) or not bool((total <= 1 + slack).all()):  # (NaN fails)
            what = ("a negative entry" if bool((target < 0).any()) else
                    f"a row summing to {float(total.reshape(-1)[int(xp.argmax(xp.where(total == total, total, xp.inf)))])!r}")
            return (f"target must be non-negative and sum to at most 1 along {word} {axis} (the rest is the sink's, "
                    f"within {slack:.1e}); it has {what}")
        return None


#: the sink (``sink=``), in :data:`numeric.constraints.SETS`
SINK = register(Sink())
