"""The derivatives of a map on the simplex and its Fenchel-Young loss's terms, on the row operations (:mod:`numeric.core.ops`).

* :func:`jvp`: ``J v = w*v - w (w.v) / sum(w)``, ``w = weight(p)`` on the support (:func:`weights`);
* :func:`param_vjp`: ``sum_i u_i dp_i/dq = -(J u) . c`` with ``c = omega_prime_d_q(p)``;
* :func:`threshold_weights`: the threshold ``tau`` of a constrained map as a differentiable expression of ``p``;
* :func:`omega_terms`: the loss ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i`` per row.
"""

from __future__ import annotations

import math

from .ops import Routines, TensorOps

__all__ = ["weights", "centred", "jvp", "param_vjp", "threshold_weights", "omega_terms", "weight_at_zero"]


def weights(ops, r: Routines, p, at_zero=None):
    """``w = weight(p)`` on the support, 0 elsewhere, NaN where ``p`` is NaN.

    ``at_zero``: what ``weight(0)`` is, where the caller knows (a map without
    parameters): ``"zero"`` (softmax ``p``, 1.5-entmax ``sqrt(p)``): ``weight(p)`` as it is;
    ``"finite"`` (sparsemax ``1``): times the support's indicator; otherwise (or for
    a derivative of the JVP, whose ``weight'`` may be infinite at 0) the weight is
    evaluated at ``p + 1`` off the support and masked.  There a link of the power form
    ``(a (z - clip))**k`` has ``weight(p) = g'(z) = a k p**(1 - 1/k)``, evaluated as
    ``a k exp((1 - 1/k) log p)`` (a printed power of a tensor exponent costs several
    times a log and an exp).
    """
    if at_zero == "zero":
        return r.weight(p)
    pos = ops.support(p)
    if at_zero == "finite":
        # (+ 0 p: a constant weight such as sparsemax's 1 would drop a NaN p, and a NaN row's JVP must stay NaN)
        return r.weight(p) * pos + 0 * p
    safe = p + (1 - pos)
    if r.module.LINK_FORM == "power" and r.has("link_scale"):
        a, k = r.link_scale(), r.link_exponent()
        return ops.exp((1 - 1 / k) * ops.log(safe)) * (pos * (a * k))
    return r.weight(safe) * pos


def centred(ops, w, v, extra=None):
    """``(w * (v - mean), mean)``, ``mean = (w.v) / sum(w)`` per row (0 where ``sum(w) = 0``); ``extra``: ``(w_e,
    v_e)``, one more coordinate per row (``(rows, 1)``, a sink's) in the sums, left out of the result (the rows
    ``[w, w_e]``, ``[v, v_e]`` without a copy)."""
    total = ops.row_sum(w)
    dot = ops.row_sum(w * v)
    if extra is not None:
        total, dot = total + extra[0], dot + extra[0] * extra[1]
    mean = ops.where(total > 0, dot / ops.where(total > 0, total, 1), 0)
    return w * (v - mean), mean


def jvp(ops: TensorOps, r: Routines, p, v, at_zero=None):
    """``J v = w*v - w (w.v) / sum(w)`` at ``p = m(x)``, ``w = weight(p)`` on the support (``J`` is symmetric: also the VJP).

    ``at_zero``: see :func:`weights`.
    """
    return centred(ops, weights(ops, r, p, at_zero), v)[0]


def param_vjp(ops: TensorOps, r: Routines, p, u, name: str, ju=None):
    """``sum_i u_i dp_i/dq`` per row, shape ``(rows, 1)``, for the parameter ``name``: ``-(J u) . c``, ``c = omega_prime_d_q(p)``.

    ``ju``: ``J u`` if already computed.
    """
    pos = ops.support(p)
    c = getattr(r, f"omega_prime_d_{name}")(p + (1 - pos)) * pos
    ju = jvp(ops, r, p, u) if ju is None else ju
    return -ops.row_sum(ju * c)


def threshold_weights(ops: TensorOps, r: Routines, cset, p, *rows):
    """``(free, a)`` at ``p`` over the constraint set ``cset`` (its arrays laid out as ``rows``): where ``p`` moves
    with the scores, and weights ``a = w / sum w`` there (0 elsewhere, and in a row where nothing moves).

    On an entry that moves ``omega'(p_i) = s_i - tau``, so ``tau = sum_i a_i (s_i - omega'(p_i))`` for any weights
    summing to 1 over those entries (a set that does not fix the sum has no threshold: ``a = 0``).  With ``a`` held constant (no gradient) that expression's derivative in the
    scores, the set's arrays and the map's parameters, through ``p``, is the threshold's: ``sum_i a_i (v_i -
    omega''(p_i) dp_i)``, the ``dtau`` that keeps the set's sums (``v``: the scores' tangent less the parameters'
    ``c dq``).  A row where nothing moves (every entry at 0 or at its bound) has one-sided derivatives: 0 here."""
    free = cset.moving(ops, p, *rows)
    if not cset.summed:  # (no threshold: tau = 0, whose weights are 0)
        return free, 0 * p
    w = ops.where(free, weights(ops, r, p), 0)
    total = ops.row_sum(w)
    return free, w / ops.where(total > 0, total, 1)


def omega_terms(ops: TensorOps, r: Routines, x, p, y, shift: bool = True):
    """Per row ``sum_i [omega(y_i) - omega(p_i)] - (y_i - p_i) s_i``, shape ``(..., 1)``: the Fenchel-Young loss of
    the map's ``p = m(x)`` against the distributions ``y`` (``numeric.Map.loss_and_grad``'s terms).

    ``s`` is the scores shifted by their row maximum (masked scores left out), where ``shift`` (the sums of ``y`` and
    ``p`` agree: the loss is invariant to the shift); ``omega(0)`` is the module's
    ``omega_zero``.  A ``p_i = 0`` of a dense map (underflow far below the maximum) where ``y_i > 0``, or a
    target with mass on a masked score, gives ``+inf``; a NaN score NaN.  Differentiable in the parameters
    where the target differentiates (``p`` and ``s`` are constants of the envelope theorem).
    """
    finite = ops.isfinite(x)
    m = ops.row_max(ops.where(finite, x, -math.inf))
    s = ops.where(finite, x - ops.where(ops.isfinite(m), m, 0) if shift else x, 0)
    zero = ops.full(m, 0.0) + r.omega_zero()
    infinite_at_zero = ops.not_(ops.isfinite(zero))

    def omega_of(q):
        pos = q > 0
        return ops.where(pos, r.omega(ops.where(pos, q, 1)), zero), ops.where(pos, q * s, 0)

    om_p, ps = omega_of(p)
    om_y, ys = omega_of(y)
    term = (om_y - om_p) - (ys - ps)
    term = ops.rare(infinite_at_zero, lambda: ops.where((p == 0) & (y > 0) & infinite_at_zero, math.inf, term),
                    lambda: term)
    value = ops.row_sum(ops.where(finite & (y != p), term, 0))
    value = ops.where(ops.row_max(ops.where(finite, 0, y)) > 0, math.inf, value)
    return ops.where(ops.isnan(ops.row_max(x)), math.nan, value)


def weight_at_zero(module) -> str | None:
    """:func:`weights`' ``at_zero`` for a map module: ``"zero"`` or ``"finite"`` where the map has no parameters
    and its ``weight(0)`` is 0 or a finite number, else ``None`` (read off the module's NumPy ``weight``)."""
    import numpy as np  # (the module's NumPy routine, on a NumPy zero: a Python 0.0 may divide by zero)

    if module.PARAMETERS:
        return None
    with np.errstate(all="ignore"):  # (0 ** negative, log(0): the weight's off-support branches)
        w0 = float(module.weight(np.float64(0.0)))
    return "zero" if w0 == 0 else "finite" if math.isfinite(w0) else None
