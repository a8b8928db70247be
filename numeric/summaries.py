"""Summary (score) functions ``s = f(queries, keys)`` with their backward passes.

Each ``*_scores`` function returns scores of shape ``(..., L, S)`` for queries
``(..., L, E)`` and keys ``(..., S, E)``; the matching ``*_backward`` takes the
same inputs and ``ds`` (the gradient of the scores) and returns the gradients
of every input, in order.

* dot product ``q k^T``; scaled dot product ``q k^T / sqrt(E)`` (or ``scale``);
* bilinear ``q W k^T`` with ``W`` of shape ``(E_q, E_k)``;
* additive (Bahdanau et al., 2015) ``s_ij = u^T tanh(W_q q_i + W_k k_j)`` with
  ``W_q (H, E_q)``, ``W_k (H, E_k)``, ``u (H,)``;
* basis-function summaries (Martins et al., 2020):
  ``s(t) = sum_j theta_j psi_j(t)``, a linear combination of basis functions of
  the position ``t`` with data-dependent weights ``theta``: ``s = theta Psi^T`` for
  ``theta (..., J)`` and ``Psi (S, J)`` from :func:`canonical_basis` (plain
  discrete attention: ``s = theta``), :func:`exponential_decay_basis` (a prior
  that favours recent positions) or :func:`gaussian_basis` (a kernel smoother).

:func:`numeric.attention` takes any of them as ``scores=``: a name (``"dot"``,
``"scaled_dot"``) or a :class:`ScoreFunction` (:class:`Dot`, :class:`ScaledDot`,
:class:`Bilinear`, :class:`Additive`, or one of your own), and
:func:`numeric.attention_backward` returns the gradients of its parameters.  A
basis-function summary is the dot score with the basis as the keys:
``attention(theta, gaussian_basis(S, centers, width), v, scores="dot", mapping="entmax15")``
(and ``dk`` is the gradient of a learned basis).
"""

from __future__ import annotations

import math

import numpy as np

from .backend import array_module

__all__ = [
    "dot_scores", "dot_backward",
    "scaled_dot_scores", "scaled_dot_backward",
    "bilinear_scores", "bilinear_backward",
    "additive_scores", "additive_backward",
    "basis_scores", "basis_backward",
    "canonical_basis", "exponential_decay_basis", "gaussian_basis",
    "ScoreFunction", "Dot", "ScaledDot", "Bilinear", "Additive", "score_function",
]


def _t(a, xp):
    return xp.swapaxes(a, -1, -2)


def _check(q, k):
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"queries and keys must be (..., length, features), got {q.shape} and {k.shape}")


def _check_bilinear(q, k, w):
    if w.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(f"bilinear weight must have shape {(q.shape[-1], k.shape[-1])}, got {w.shape}")


def _check_additive(q, k, wq, wk, u):
    if wq.ndim != 2 or wk.ndim != 2 or wq.shape[1] != q.shape[-1] or wk.shape[1] != k.shape[-1] or wq.shape[0] != wk.shape[0] \
            or u.shape != (wq.shape[0],):
        raise ValueError(f"additive weights do not fit: q {q.shape}, k {k.shape}, W_q {wq.shape}, W_k {wk.shape}, u {u.shape}")


def dot_scores(q, k):
    """``q k^T``."""
    xp = array_module(q, k)
    _check(q, k)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"dot product needs equal feature sizes: q {q.shape}, k {k.shape}")
    return q @ _t(k, xp)


def dot_backward(q, k, ds):
    """``(dq, dk) = (ds k, ds^T q)``."""
    xp = array_module(q, k, ds)
    return ds @ k, _t(ds, xp) @ q


def scaled_dot_scores(q, k, scale=None):
    """``q k^T * scale`` with ``scale = 1/sqrt(E)`` by default."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return dot_scores(q, k) * scale


def scaled_dot_backward(q, k, ds, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    dq, dk = dot_backward(q, k, ds)
    return dq * scale, dk * scale


def bilinear_scores(q, k, w):
    """``q W k^T`` with ``W`` of shape ``(E_q, E_k)``."""
    xp = array_module(q, k, w)
    _check(q, k)
    _check_bilinear(q, k, w)
    return (q @ w) @ _t(k, xp)


def bilinear_backward(q, k, w, ds):
    """``(dq, dk, dW) = (ds k W^T, ds^T q W, sum over batch of q^T ds k)``."""
    xp = array_module(q, k, w, ds)
    dq = ds @ k @ w.T
    dk = _t(ds, xp) @ q @ w
    dw = (_t(q, xp) @ ds @ k).reshape(-1, *w.shape).sum(axis=0)
    return dq, dk, dw


def additive_scores(q, k, wq, wk, u):
    """``s_ij = u^T tanh(W_q q_i + W_k k_j)``; memory ``L x S x H`` per batch element."""
    xp = array_module(q, k, wq, wk, u)
    _check(q, k)
    _check_additive(q, k, wq, wk, u)
    hidden = xp.tanh((q @ wq.T)[..., :, None, :] + (k @ wk.T)[..., None, :, :])
    return hidden @ u


def additive_backward(q, k, wq, wk, u, ds):
    """Gradients ``(dq, dk, dW_q, dW_k, du)`` of the additive summary."""
    xp = array_module(q, k, wq, wk, u, ds)
    hidden = xp.tanh((q @ wq.T)[..., :, None, :] + (k @ wk.T)[..., None, :, :])  # (..., L, S, H)
    du = (ds[..., None] * hidden).reshape(-1, u.shape[0]).sum(axis=0)
    dpre = ds[..., None] * (1 - hidden * hidden) * u  # (..., L, S, H)
    dhq = dpre.sum(axis=-2)  # (..., L, H)
    dhk = dpre.sum(axis=-3)  # (..., S, H)
    dq, dk = dhq @ wq, dhk @ wk
    dwq = (_t(dhq, xp) @ q).reshape(-1, *wq.shape).sum(axis=0)
    dwk = (_t(dhk, xp) @ k).reshape(-1, *wk.shape).sum(axis=0)
    return dq, dk, dwq, dwk, du


def basis_scores(theta, psi):
    """``s = theta Psi^T``: scores ``(..., S)`` from weights ``theta (..., J)`` and a basis ``Psi (S, J)``."""
    if psi.ndim != 2 or theta.shape[-1] != psi.shape[1]:
        raise ValueError(f"basis of shape {psi.shape} does not fit weights of shape {theta.shape}")
    return theta @ psi.T


def basis_backward(theta, psi, ds):
    """``(dtheta, dPsi) = (ds Psi, sum over batch of ds^T theta)``."""
    dtheta = ds @ psi
    dpsi = ds.reshape(-1, psi.shape[0]).T @ theta.reshape(-1, psi.shape[1])
    return dtheta, dpsi


def canonical_basis(length: int, dtype=np.float64):
    """``Psi = I``: one basis function per position, so ``s = theta`` (plain discrete attention)."""
    return np.eye(length, dtype=dtype)


def exponential_decay_basis(length: int, rates, dtype=np.float64):
    """``psi_j(t) = exp(-rate_j (length - 1 - t))``: recent positions weigh more, at several rates."""
    rates = np.asarray(rates, dtype=dtype)
    if rates.ndim != 1 or (rates < 0).any():
        raise ValueError(f"rates must be a 1-D array of non-negative numbers, got {rates}")
    t = np.arange(length, dtype=dtype)[:, None]
    return np.exp(-rates[None, :] * (length - 1 - t))


def gaussian_basis(length: int, centers, width: float, dtype=np.float64):
    """``psi_j(t) = exp(-(t - c_j)^2 / (2 width^2))``: a Gaussian kernel smoother over positions."""
    centers = np.asarray(centers, dtype=dtype)
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    t = np.arange(length, dtype=dtype)[:, None]
    return np.exp(-((t - centers[None, :]) ** 2) / (2 * width**2))


class ScoreFunction:
    """A summary ``s = f(q, k; params)`` that :func:`numeric.attention` can use as ``scores=``.

    Subclasses set :attr:`params` (a dict of arrays, the learnable parameters,
    possibly empty) and implement :meth:`__call__` and :meth:`backward`; they may
    override :meth:`check`.  Attention calls them on blocks: ``q`` holds some of
    the queries ``(..., l, E_q)``, ``k`` some of the keys ``(..., s, E_k)``, and the
    scores must be ``(..., l, s)`` with ``s_ij`` depending on ``q_i`` and ``k_j``
    only (so blocks of queries and keys can be scored apart).  Leading
    dimensions broadcast; the parameters are shared by the whole batch.
    """

    params: dict = {}

    def __call__(self, q, k):
        """Scores ``(..., l, s)``."""
        raise NotImplementedError

    def backward(self, q, k, ds):
        """``(dq, dk, dparams)`` of ``sum(ds * self(q, k))``; ``dparams`` has the keys of :attr:`params`."""
        raise NotImplementedError

    def check(self, q, k):
        """Raise :class:`ValueError` if queries ``q`` and keys ``k`` (whole inputs) do not fit this function."""

    def replace(self, **params):
        """The same function with new parameter values (the layers rebuild it from their ``params``)."""
        unknown = set(params) - set(self.params)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no parameter(s) {sorted(unknown)}; it has {sorted(self.params)}")
        return type(self)(**{**self.params, **params})

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{tuple(getattr(v, 'shape', ()))}" for k, v in self.params.items())
        return f"{type(self).__name__}({shapes})"


class Dot(ScoreFunction):
    """``q k^T`` (also the basis-function summary, with the basis as the keys)."""

    def __init__(self):
        self.params = {}

    def __call__(self, q, k):
        return dot_scores(q, k)

    def backward(self, q, k, ds):
        return (*dot_backward(q, k, ds), {})

    def check(self, q, k):
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"dot product needs equal feature sizes: q {q.shape}, k {k.shape}")


class ScaledDot(Dot):
    """``q k^T * scale``, ``scale = 1/sqrt(E)`` by default (attention's default score)."""

    def __init__(self, scale=None):
        self.params = {}
        self.scale = scale

    def __call__(self, q, k):
        return scaled_dot_scores(q, k, self.scale)

    def backward(self, q, k, ds):
        return (*scaled_dot_backward(q, k, ds, self.scale), {})

    def replace(self, **params):
        super().replace(**params)
        return ScaledDot(self.scale)

    def __repr__(self) -> str:
        return f"ScaledDot(scale={self.scale!r})"


class Bilinear(ScoreFunction):
    """``q W k^T`` with a learnable ``W`` ``(E_q, E_k)``."""

    def __init__(self, w):
        self.params = {"w": w}

    def __call__(self, q, k):
        return bilinear_scores(q, k, self.params["w"])

    def backward(self, q, k, ds):
        dq, dk, dw = bilinear_backward(q, k, self.params["w"], ds)
        return dq, dk, {"w": dw}

    def check(self, q, k):
        _check_bilinear(q, k, self.params["w"])


class Additive(ScoreFunction):
    """Bahdanau's ``u^T tanh(W_q q_i + W_k k_j)`` with learnable ``wq (H, E_q)``, ``wk (H, E_k)``, ``u (H,)``.

    Each block of ``l`` queries and ``s`` keys holds ``l x s x H`` numbers.
    """

    def __init__(self, wq, wk, u):
        self.params = {"wq": wq, "wk": wk, "u": u}

    def __call__(self, q, k):
        p = self.params
        return additive_scores(q, k, p["wq"], p["wk"], p["u"])

    def backward(self, q, k, ds):
        p = self.params
        dq, dk, dwq, dwk, du = additive_backward(q, k, p["wq"], p["wk"], p["u"], ds)
        return dq, dk, {"wq": dwq, "wk": dwk, "u": du}

    def check(self, q, k):
        _check_additive(q, k, self.params["wq"], self.params["wk"], self.params["u"])


_NAMED = {"dot": Dot, "scaled_dot": ScaledDot}


def score_function(scores) -> ScoreFunction:
    """A :class:`ScoreFunction` from a name (``"dot"``, ``"scaled_dot"``) or an instance."""
    if isinstance(scores, ScoreFunction):
        return scores
    if isinstance(scores, str) and scores in _NAMED:
        return _NAMED[scores]()
    raise ValueError(f"scores must be one of {sorted(_NAMED)} or a numeric.summaries.ScoreFunction, got {scores!r}")
