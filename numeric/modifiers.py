"""Score modifiers: what attention does to its scores before the map, each in one place.

* :class:`LengthScale` (``length_scale=``, Scalable-Softmax and Llama 4): each query's scores times a factor of its
  position, ``f_i = base + coef log x_i``.  A factor per query row is a factor on the query,
  ``(f_i q_i) . k_j = f_i (q_i . k_j)``, so every executor applies it to the queries
  (:meth:`LengthScale.factor`), before the scale, the cap and the mask, and the gradients in the queries and in
  ``coef`` follow by the chain rule (autograd in torch and JAX, :func:`numeric.attention.attention_backward` in
  NumPy).
* :class:`Softcap` (``softcap=c``, Gemma 2): ``s -> c tanh(s / c)``, applied to the scores before a mask or bias is
  added; its derivative ``1 - (c tanh(s / c) / c)^2`` is a function of the capped score (:meth:`Softcap.slope`).
* the sliding window (``window=w``) is a plan's: :class:`numeric.plan.Plan`.

The executors (NumPy's and torch's attention, which compute their own backward, and JAX's, which differentiates
through ``__call__``) take a modifier from :func:`softcap` and :func:`length_scale` and apply it to each block of
scores (the cap) or to the queries (the length scale).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .plan import Plan, keyword_shape

__all__ = ["Softcap", "softcap", "LengthScale", "length_scale", "ssmax", "llama4"]


class Softcap:
    """``s -> c tanh(s / c)`` for a cap ``c > 0``: scores squashed into ``(-c, c)``, close to ``s`` where
    ``|s| << c``."""

    def __init__(self, cap: float):
        self.cap = cap

    def __call__(self, tanh, s):
        """The capped scores, ``tanh`` the array namespace's (``numpy.tanh``, ``torch.tanh``, ``jax.numpy.tanh``)."""
        return self.cap * tanh(s / self.cap)

    def slope(self, capped):
        """``d capped / d s`` at the capped scores: ``1 - (capped / c)^2``."""
        t = capped / self.cap
        return 1 - t * t

    def __repr__(self) -> str:
        return f"Softcap({self.cap!r})"


def softcap(value) -> Softcap | None:
    """The :class:`Softcap` of attention's ``softcap=`` keyword (``None``: none), checked: a real number, finite and
    ``> 0``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) < math.inf):
        raise ValueError(f"softcap must be a finite number > 0, got {value!r}")
    return Softcap(float(value))


class LengthScale:
    """Each query's scores times ``f_i = base + coef * log(x_i)``, with ``x_i`` from the query's position ``i``
    (from ``start``) and the number ``n_i`` of keys it sees (``S``; with causal attention ``min(i + 1, S)``; with a
    window at most ``window``; a mask does not change it): made by :func:`ssmax` and :func:`llama4`.

    * ``ssmax(s)``, Scalable-Softmax (Nakanishi 2025): ``f_i = s log n_i`` (``x_i = max(n_i, 1)``), so that a
      softmax over ``n`` keys stays as peaked as ``n`` grows;
    * ``llama4(a, floor)``, Llama 4's attention temperature tuning: ``f_i = 1 + a log(1 + floor((i + 1) / floor))``
      (transformers' ``attn_scale`` ``a`` and ``floor_scale``).

    ``coef`` is a number, or an array of the executor's kind (a tensor that requires grad gets a gradient) of one
    value per head, ``(H,)``, or broadcastable to the scores with size 1 along the keys.  The factor multiplies the
    scores before the cap (``softcap=``), the mask and the map; it is applied to the queries
    (:meth:`factor`).
    """

    def __init__(self, coef, *, base: float, floor: int | None = None, start: int = 0):
        if isinstance(coef, bool) or isinstance(coef, numbers.Number) and not isinstance(coef, numbers.Real):
            raise ValueError(f"the length scale's coefficient must be a real number or an array, got {coef!r}")
        if isinstance(coef, numbers.Real) and not math.isfinite(coef):
            raise ValueError(f"the length scale's coefficient must be finite, got {coef!r}")
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, numbers.Integral) or floor < 1):
            raise ValueError(f"floor must be an integer >= 1, got {floor!r}")
        if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
            raise ValueError(f"start must be an integer >= 0, got {start!r}")
        self.coef = float(coef) if isinstance(coef, numbers.Real) else coef
        self.base, self.floor, self.start = float(base), None if floor is None else int(floor), int(start)

    def __repr__(self) -> str:
        coef = self.coef if isinstance(self.coef, float) else f"<array of shape {tuple(self.coef.shape)}>"
        if self.floor is None:
            return f"ssmax({coef})"
        return f"llama4({coef}, floor={self.floor}" + (f", start={self.start})" if self.start else ")")

    def logs(self, plan: Plan) -> np.ndarray:
        """``log(x_i)`` for each of the plan's query rows, shape ``(L, 1)``, float64."""
        if self.floor is None:
            return np.log(np.maximum(plan.seen(), 1).astype(np.float64))[:, None]
        position = np.arange(plan.L, dtype=np.int64) + plan.offset + self.start
        return np.log1p((position + 1) // self.floor).astype(np.float64)[:, None]

    def coef_shape(self, shape: tuple, scores: tuple, layout: str = "(batch, H, L, S)") -> tuple:
        """The shape an array ``coef`` of ``shape`` takes against the scores ``(..., H, L, S)`` (in the executor's
        order): ``(H,)`` is ``(H, 1, 1)``; one value per key is refused (:class:`ValueError`)."""
        shape = keyword_shape("the length scale's coefficient", shape, scores, False, layout)
        if len(shape) and shape[-1] != 1:
            raise ValueError(f"the length scale's coefficient of shape {shape} must have size 1 along the keys (one "
                             f"value per head or per query)")
        return shape

    def factor(self, logs, coef):
        """``f = base + coef * logs``: ``logs`` the executor's array of :meth:`logs`, ``coef`` :attr:`coef` as the
        executor's number or array shaped by :meth:`coef_shape`; a factor per query row, ``(..., L, 1)``, for the
        queries."""
        return coef * logs + self.base if self.base else coef * logs


def ssmax(s=1.0) -> LengthScale:
    """Scalable-Softmax's length scale (Nakanishi 2025): each query's scores times ``s log n``, ``n`` the number of
    keys the query sees; ``s`` a number or an array, one per head (learnable).  :class:`LengthScale`."""
    return LengthScale(s, base=0.0)


def llama4(a=0.1, floor: int = 8192, start: int = 0) -> LengthScale:
    """Llama 4's attention temperature tuning: each query's scores times ``1 + a log(1 + floor((i + 1) / floor))``,
    ``i`` its position counted from ``start`` (a decoding step's ``start`` is the length of the cache before it).
    transformers' defaults: ``a = 0.1`` (``attn_scale``), ``floor = 8192`` (``floor_scale``).  :class:`LengthScale`."""
    return LengthScale(a, base=1.0, floor=floor, start=start)


def length_scale(value) -> LengthScale | None:
    """The :class:`LengthScale` of attention's ``length_scale=`` keyword (``None``: none), checked."""
    if value is None or isinstance(value, LengthScale):
        return value
    raise TypeError(f"length_scale must be made by numeric.modifiers.ssmax(s) or llama4(a, floor), got {value!r}")
