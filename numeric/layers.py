"""Layers: single-head self-attention and multi-head attention.

Both keep what the backward pass needs from their last forward call and fill
``grads`` (same keys as ``params``) on :meth:`backward`.  Both keep the
attention weights of the last forward call only when asked
(``forward(..., need_weights=True)``): they are ``L x S`` per head.  Both take
their parameters' dtype from one policy (:func:`_float_dtype`).
"""

from __future__ import annotations

import math

import numpy as np

from .attention import attention, attention_backward
from .backend import array_module
from .maps import get_map

__all__ = ["SelfAttention", "MultiHeadAttention", "sinusoidal_encoding"]


def _move(params: dict, where: str) -> dict:
    """``params`` as NumPy (``"numpy"``/``"cpu"``) or CuPy (``"cupy"``/``"gpu"``) arrays."""
    if where in ("numpy", "cpu"):
        return {k: (v.get() if type(v).__module__.split(".")[0] == "cupy" else np.asarray(v)) for k, v in params.items()}
    if where in ("cupy", "gpu"):
        import cupy

        return {k: cupy.asarray(v) for k, v in params.items()}
    raise ValueError(f"where must be 'numpy', 'cpu', 'cupy' or 'gpu', got {where!r}")


def _float_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy floating dtype; anything else is refused (the layers' parameters are real numbers)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a floating type (float16, float32 or float64), got {dtype!r}") from None
    if dt.kind != "f":
        raise TypeError(f"dtype must be a floating type (float16, float32 or float64), got {dt}")
    return dt


def _check_dy(dy, shape):
    if tuple(dy.shape) != tuple(shape):
        raise ValueError(f"dy must have the shape of the last forward's output {tuple(shape)}, got {tuple(dy.shape)}")


def sinusoidal_encoding(length: int, dim: int, dtype=np.float64) -> np.ndarray:
    """``PE[t, 2i] = sin(t / 10000^(2i/d))``, ``PE[t, 2i+1] = cos(...)`` (Vaswani et al.)."""
    if length < 0 or dim <= 0:
        raise ValueError(f"positional encoding needs length >= 0 and dim > 0, got {length}, {dim}")
    t = np.arange(length)[:, None]
    i = np.arange(dim)[None, :]
    angle = t / np.power(10000.0, (2 * (i // 2)) / dim)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(dtype)


class _Movable:
    """Layers whose ``params`` can move between NumPy and CuPy."""

    params: dict
    grads: dict

    def to(self, where: str):
        """Move the parameters to ``"cupy"`` (the current GPU) or ``"numpy"``; returns ``self``."""
        self.params = _move(self.params, where)
        self.grads = {}
        return self


class SelfAttention(_Movable):
    """``Y = W (X V)`` with ``W = map((X Q)(X K)^T / sqrt(d))`` for ``X`` of shape ``(..., l, d)``.

    The parameters ``Q``, ``K``, ``V`` are ``d x d`` matrices multiplied on the
    right; ``params`` holds them as ``"Q"``, ``"K"``, ``"V"``
    (of a floating ``dtype``).  :attr:`attention_weights` holds ``W`` of the last
    forward call made with ``need_weights=True`` (else ``None``).
    """

    def __init__(self, dim: int, *, mapping="softmax", causal: bool = False, dtype="float64", seed=None):
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dtype = _float_dtype(dtype)
        rng = np.random.default_rng(seed)
        bound = 1 / math.sqrt(dim)
        self.dim, self.causal, self.mapping = dim, causal, get_map(mapping)
        self.params = {name: rng.uniform(-bound, bound, (dim, dim)).astype(self.dtype) for name in ("Q", "K", "V")}
        self.grads: dict = {}
        self._cache = None
        self.attention_weights = None

    def forward(self, x, *, mask=None, need_weights: bool = False):
        """``Y`` for ``x`` of shape ``(..., l, d)``; ``need_weights=True`` keeps ``W`` in :attr:`attention_weights`."""
        xp = array_module(x)
        x = xp.asarray(x)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., length, {self.dim}), got {x.shape}")
        P = {k: xp.asarray(v) for k, v in self.params.items()}
        q, k, v = x @ P["Q"], x @ P["K"], x @ P["V"]
        if need_weights:
            y, w = attention(q, k, v, mapping=self.mapping, mask=mask, causal=self.causal, return_weights=True)
        else:
            y, w = attention(q, k, v, mapping=self.mapping, mask=mask, causal=self.causal), None
        self._cache = (x, q, k, v, mask, y.shape)
        self.attention_weights = w
        return y

    def backward(self, dy):
        """``dx`` of ``sum(dy * y)`` for the last forward call; fills :attr:`grads`."""
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() first")
        x, q, k, v, mask, shape = self._cache
        xp = array_module(x)
        dy = xp.asarray(dy)
        _check_dy(dy, shape)
        dq, dk, dv = attention_backward(q, k, v, dy, mapping=self.mapping, mask=mask, causal=self.causal)
        P = {kk: xp.asarray(vv) for kk, vv in self.params.items()}
        flat = x.reshape(-1, self.dim)
        self.grads = {
            "Q": flat.T @ dq.reshape(-1, self.dim),
            "K": flat.T @ dk.reshape(-1, self.dim),
            "V": flat.T @ dv.reshape(-1, self.dim),
        }
        return dq @ P["Q"].T + dk @ P["K"].T + dv @ P["V"].T


class MultiHeadAttention(_Movable):
    """Multi-head attention with any derived map, batch first.

    ``y = concat_h(attention(x_q W_q^h, x_k W_k^h, x_v W_v^h)) W_o^T + b_o`` with
    projections ``x @ W.T + b`` (PyTorch's ``(out, in)`` convention) and per-head
    scale ``1/sqrt(embed_dim / num_heads)``.

    Parameters
    ----------
    embed_dim, num_heads:
        ``num_heads`` must divide ``embed_dim``.
    mapping:
        The attention map (name, generated module or :class:`~numeric.maps.Map`).
    causal:
        Query ``i`` sees keys ``j <= i``.
    bias:
        Whether the four projections have biases.
    dtype:
        Parameter dtype, a floating type.
    seed:
        Seed of the uniform(-1/sqrt(E), 1/sqrt(E)) initialisation.
    positional:
        ``None``, ``"sinusoidal"`` (added to the inputs) or ``"learned"``
        (a parameter ``positional`` of shape ``(max_len, E)``, added to the inputs).
    max_len:
        Longest sequence for ``positional="learned"``.

    Attributes
    ----------
    params, grads:
        ``q_weight``, ``k_weight``, ``v_weight``, ``out_weight`` ``(E, E)`` and
        (with ``bias``) ``q_bias``, ``k_bias``, ``v_bias``, ``out_bias`` ``(E,)``
        (and ``positional`` when learned).
    attention_weights:
        ``(N, H, L, S)`` weights of the last forward call, per head, if it was
        made with ``need_weights=True``; else ``None``.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, mapping="softmax", causal: bool = False, bias: bool = True,
                 dtype="float32", seed=None, positional=None, max_len: int = 4096):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be positive, got {embed_dim}, {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads = {num_heads} does not divide embed_dim = {embed_dim}")
        if positional not in (None, "sinusoidal", "learned"):
            raise ValueError(f"positional must be None, 'sinusoidal' or 'learned', got {positional!r}")
        self.dtype = _float_dtype(dtype)
        rng = np.random.default_rng(seed)
        bound = 1 / math.sqrt(embed_dim)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.causal, self.bias, self.positional = causal, bias, positional
        self.mapping = get_map(mapping)
        self.params = {}
        for name in ("q", "k", "v", "out"):
            self.params[f"{name}_weight"] = rng.uniform(-bound, bound, (embed_dim, embed_dim)).astype(self.dtype)
        if bias:
            for name in ("q", "k", "v", "out"):
                self.params[f"{name}_bias"] = np.zeros(embed_dim, dtype=self.dtype)
        if positional == "learned":
            self.params["positional"] = (0.02 * rng.standard_normal((max_len, embed_dim))).astype(self.dtype)
        self.grads: dict = {}
        self.attention_weights = None
        self._cache = None

    # ----------------------------------------------------------------- helpers
    def _param(self, name, xp):
        return xp.asarray(self.params[name])

    def _project(self, x, name, xp):
        y = x @ self._param(f"{name}_weight", xp).T
        if self.bias:
            y = y + self._param(f"{name}_bias", xp)
        return y

    def _split(self, x):  # (N, L, E) -> (N, H, L, D)
        n, length, _ = x.shape
        return x.reshape(n, length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    def _merge(self, x):  # (N, H, L, D) -> (N, L, E)
        n, _, length, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(n, length, self.embed_dim)

    def _encode(self, x, xp):
        if self.positional is None:
            return x
        length = x.shape[1]
        if self.positional == "sinusoidal":
            return x + xp.asarray(sinusoidal_encoding(length, self.embed_dim, x.dtype))
        table = self._param("positional", xp)
        if length > table.shape[0]:
            raise ValueError(f"sequence length {length} exceeds max_len {table.shape[0]} of the learned encoding")
        return x + table[:length]

    # ----------------------------------------------------------------- forward
    def forward(self, query, key=None, value=None, *, mask=None, need_weights: bool = False):
        """``(N, L, E)`` output for ``query (N, L, E)``, ``key (N, S, E)``, ``value (N, S, E)``.

        ``key`` defaults to ``query`` and ``value`` to ``key``.  ``mask``
        broadcasts to ``(N, H, L, S)`` (e.g. ``(L, S)`` or ``(N, 1, L, S)``).
        ``need_weights=True`` keeps the weights in :attr:`attention_weights`
        (``N H L S`` of memory, and the dense path); by default they are not
        kept (``None``) and long sequences go through the blocked paths.
        """
        self_attn = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        xp = array_module(query, key, value)
        query, key, value = (xp.asarray(a) for a in (query, key, value))
        for name, a in (("query", query), ("key", key), ("value", value)):
            if a.ndim != 3 or a.shape[-1] != self.embed_dim:
                raise ValueError(f"{name} must have shape (N, length, {self.embed_dim}), got {a.shape}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"shapes do not match: query {query.shape}, key {key.shape}, value {value.shape}")
        xq, xk, xv = self._encode(query, xp), self._encode(key, xp), self._encode(value, xp)
        q = self._split(self._project(xq, "q", xp))
        k = self._split(self._project(xk, "k", xp))
        v = self._split(self._project(xv, "v", xp))
        if need_weights:
            heads, weights = attention(q, k, v, mapping=self.mapping, mask=mask, causal=self.causal, return_weights=True)
        else:
            heads, weights = attention(q, k, v, mapping=self.mapping, mask=mask, causal=self.causal), None
        merged = self._merge(heads)
        y = self._project(merged, "out", xp)
        self._cache = dict(xq=xq, xk=xk, xv=xv, q=q, k=k, v=v, merged=merged, mask=mask, self_attn=self_attn,
                           same_kv=value is key, shape=y.shape)
        self.attention_weights = weights
        return y

    def backward(self, dy):
        """Input gradient(s) of ``sum(dy * y)``; fills :attr:`grads`.

        Returns ``dquery`` for self-attention (``key`` and ``value`` omitted),
        else ``(dquery, dkey, dvalue)``.
        """
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() first")
        c = self._cache
        xp = array_module(dy)
        dy = xp.asarray(dy)
        _check_dy(dy, c["shape"])
        E = self.embed_dim
        grads = {}
        grads["out_weight"] = dy.reshape(-1, E).T @ c["merged"].reshape(-1, E)
        if self.bias:
            grads["out_bias"] = dy.reshape(-1, E).sum(axis=0)
        dmerged = dy @ self._param("out_weight", xp)
        dq, dk, dv = attention_backward(c["q"], c["k"], c["v"], self._split(dmerged), mapping=self.mapping,
                                        mask=c["mask"], causal=self.causal)
        inputs = {}
        for name, d, x in (("q", dq, c["xq"]), ("k", dk, c["xk"]), ("v", dv, c["xv"])):
            d = self._merge(d)
            grads[f"{name}_weight"] = d.reshape(-1, E).T @ x.reshape(-1, E)
            if self.bias:
                grads[f"{name}_bias"] = d.reshape(-1, E).sum(axis=0)
            inputs[name] = d @ self._param(f"{name}_weight", xp)
        if self.positional == "learned":
            table = xp.zeros_like(self._param("positional", xp))
            for name in ("q", "k", "v"):
                length = inputs[name].shape[1]
                table[:length] += inputs[name].sum(axis=0)
            grads["positional"] = table
        self.grads = grads
        if c["self_attn"]:
            return inputs["q"] + inputs["k"] + inputs["v"]
        return inputs["q"], inputs["k"], inputs["v"]
