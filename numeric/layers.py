"""Layers: single-head self-attention and multi-head attention.

Both keep what the backward pass needs from their last forward call and fill
``grads`` (same keys as ``params``) on :meth:`backward`.  Both keep the
attention weights of the last forward call only when asked
(``forward(..., need_weights=True)``): they are ``L x S`` per head.

What they share (:class:`_Layer`):

* **dtype policy**: parameters are stored in the layer's ``dtype`` (a floating
  type; float32 by default for :class:`MultiHeadAttention`, as in PyTorch, and
  float64 for :class:`SelfAttention`, the small layer of the worked examples); a forward pass computes in
  ``result_type(inputs, dtype, float32)`` (float16 computes in float32, float64
  inputs are not rounded to float32 parameters' precision) and the gradients
  in :attr:`grads` come out in the parameters' dtype;
* **learnable map parameters**: ``learn=("alpha",)`` learns one value per
  head of each named parameter of the map (Correia et al. 2019, "Adaptively
  Sparse Transformers"), kept inside a range ``(lo, hi)`` as
  ``lo + (hi - lo) sigmoid(logit)``; the logits are the parameters
  ``"<name>_logit"``.  The range is ``ranges[name]``, else the map's declared
  domain, with an infinite upper end replaced by ``lo + 1`` (alpha-entmax:
  ``(1, 2)``, the paper's range); the starting value is the map's.  ``"sink"``
  in ``learn`` (:class:`MultiHeadAttention`) learns a sink per head instead
  (:mod:`numeric.constraints.sink`), the parameter ``"sink"`` ``(H,)`` starting
  at 0, on the whole real line;
* **score functions**: ``scores=`` as in :func:`numeric.attention`; a
  :class:`~numeric.summaries.ScoreFunction`'s parameters become the layer's
  parameters ``"scores_<name>"`` (shared by the heads);
* ``repr``, :meth:`_Layer.state_dict` / :meth:`_Layer.load_state_dict` (a dict of
  NumPy arrays: ``np.savez(path, **layer.state_dict())`` and
  ``layer.load_state_dict(np.load(path))`` save and restore a layer), and
  :meth:`_Layer.to` (NumPy or CuPy).
"""

from __future__ import annotations

import math

import numpy as np

from . import front
from .attention import attention, attention_backward
from .backend import array_module
from .maps import Map, get_map
from .summaries import score_function

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


class Movable:
    """Layers whose ``params`` can move between NumPy and CuPy."""

    params: dict
    grads: dict

    def to(self, where: str):
        """Move the parameters to ``"cupy"`` (the current GPU) or ``"numpy"``; returns ``self``."""
        self.params = _move(self.params, where)
        self.grads = {}
        return self


def _sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))  # no overflow for large |x|


class _Layer(Movable):
    """What both layers share: dtype policy, learnable map parameters, score functions, state, repr, devices."""

    _fields: tuple = ()  # constructor arguments shown by repr

    def _setup(self, mapping, dtype, learn, ranges, scores, heads: int, rng):
        self.dtype = _float_dtype(dtype)
        self.mapping: Map = get_map(mapping)
        self.scores = None if scores is None else score_function(scores)
        self.params, self.grads = {}, {}
        self.attention_weights = None
        self._cache = None
        self.learn_sink = learn is not True and "sink" in (learn or ())
        if self.learn_sink:
            learn = tuple(n for n in learn if n != "sink")
            self.params["sink"] = np.zeros(heads, dtype=self.dtype)
        learn, ranges = front.check_learned(self.mapping.module, learn, ranges)
        self.learn, self.ranges, self._heads = learn, {}, heads
        for name in learn:
            lo, hi, logit = front.learned_range(self.mapping.module, name, self.mapping.params[name], ranges.get(name))
            self.ranges[name] = (lo, hi)
            self.params[f"{name}_logit"] = np.full(heads, logit, dtype=self.dtype)
        if self.scores is not None:
            for name, value in self.scores.params.items():
                self.params[f"scores_{name}"] = np.asarray(value).astype(self.dtype)

    # ------------------------------------------------------------ dtype policy
    def _compute(self, *arrays):
        """``(xp, dtype, arrays)``: the inputs as arrays of the compute dtype ``result_type(inputs, dtype, float32)``."""
        xp = array_module(*arrays)
        arrays = [xp.asarray(a) for a in arrays]
        dt = np.result_type(*(a.dtype for a in arrays), self.dtype, np.float32)
        return xp, dt, [a.astype(dt, copy=False) for a in arrays]

    def _param(self, name, xp, dtype=None):
        value = xp.asarray(self.params[name])
        return value if dtype is None else value.astype(dtype, copy=False)

    def _finish_grads(self, grads: dict):
        """Fill :attr:`grads` in the parameters' dtype."""
        self.grads = {k: g.astype(self.params[k].dtype, copy=False) for k, g in grads.items()}

    # --------------------------------------------------- map and score function
    def _values(self, name, xp):
        """``(value, dvalue/dlogit)`` per head of a learned map parameter."""
        lo, hi = self.ranges[name]
        s = _sigmoid(self._param(f"{name}_logit", xp, np.float64))
        value = xp.clip(lo + (hi - lo) * s, np.nextafter(lo, hi), np.nextafter(hi, lo))
        return value, (hi - lo) * s * (1 - s)

    def map_params(self) -> dict:
        """The map's parameter values now: learned ones per head (NumPy float64 arrays), the others as given."""
        out = dict(self.mapping.params)
        for name in self.learn:
            value = self._values(name, np)[0] if array_module(self.params[f"{name}_logit"]) is np else \
                self._values(name, array_module(self.params[f"{name}_logit"]))[0].get()
            out[name] = np.asarray(value)
        return out

    def _map(self, xp, shape):
        """The map for this forward pass: the learned parameters per head, shaped ``shape`` (size 1 along the keys)."""
        if not self.learn:
            return self.mapping
        values = dict(self.mapping.params)
        for name in self.learn:
            value = self._values(name, xp)[0]
            values[name] = np.asarray(value.get() if hasattr(value, "get") else value).reshape(shape)
        return self.mapping.bound(values)

    def _score_function(self, xp, dtype):
        if self.scores is None or not self.scores.params:
            return self.scores
        return self.scores.replace(**{n: self._param(f"scores_{n}", xp, dtype) for n in self.scores.params})

    def _extra_grads(self, found: dict, xp) -> dict:
        """The gradients of the learned logits and score-function parameters from ``attention_backward``'s."""
        grads = {}
        for name in self.learn:
            dvalue = xp.asarray(found["map"][name]).reshape(-1)
            grads[f"{name}_logit"] = dvalue * self._values(name, xp)[1]
        for name, g in found["scores"].items():
            grads[f"scores_{name}"] = g
        if self.learn_sink:
            grads["sink"] = found["sink"]
        return grads

    @property
    def _wants_param_grads(self) -> bool:
        return bool(self.learn) or self.learn_sink or bool(self.scores is not None and self.scores.params)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The parameters as a dict of NumPy arrays (copies)."""
        return {k: (v.get() if type(v).__module__.split(".")[0] == "cupy" else np.array(v)) for k, v in self.params.items()}

    def load_state_dict(self, state, strict: bool = True):
        """Set the parameters from ``state`` (a dict of arrays, or an ``np.load`` archive); returns ``self``.

        Shapes must match; values are converted to each parameter's dtype and
        array kind.  ``strict=True`` also requires the same names, no more, no less.
        """
        names = set(state.keys()) if hasattr(state, "keys") else set(state)
        missing, unexpected = sorted(set(self.params) - names), sorted(names - set(self.params))
        if strict and (missing or unexpected):
            raise KeyError(f"state does not match the layer's parameters: missing {missing}, unexpected {unexpected}")
        new = {}
        for name in set(self.params) & names:
            value, old = np.asarray(state[name]), self.params[name]
            if value.shape != old.shape:
                raise ValueError(f"parameter {name} has shape {old.shape}; the state's has {value.shape}")
            xp = array_module(old)
            new[name] = xp.asarray(value.astype(old.dtype))
        self.params.update(new)
        self.grads = {}
        return self

    def __repr__(self) -> str:
        fields = [f"{name}={getattr(self, name)!r}" for name in self._fields]
        fields.append(f"mapping={self.mapping!r}")
        if self.scores is not None:
            fields.append(f"scores={self.scores!r}")
        if self.learn:
            fields.append("learn=" + repr(self.learn) + ", ranges=" + repr(self.ranges))
        fields.append(f"dtype={self.dtype.name}")
        return f"{type(self).__name__}({', '.join(fields)})"


class SelfAttention(_Layer):
    """``Y = W (X V)`` with ``W = map((X Q)(X K)^T / sqrt(d))`` for ``X`` of shape ``(..., l, d)``.

    The parameters ``Q``, ``K``, ``V`` are ``d x d`` matrices multiplied on the
    right; ``params`` holds them as ``"Q"``, ``"K"``, ``"V"``
    (of a floating ``dtype``).  :attr:`attention_weights` holds ``W`` of the last
    forward call made with ``need_weights=True`` (else ``None``).  ``learn``,
    ``ranges`` and ``scores`` are those of the module docstring (one head).
    """

    _fields = ("dim", "causal")

    def __init__(self, dim: int, *, mapping="softmax", causal: bool = False, dtype="float64", seed=None, learn=(),
                 ranges=None, scores=None):
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        rng = np.random.default_rng(seed)
        self.dim, self.causal = dim, causal
        if learn is not True and "sink" in (learn or ()):
            raise ValueError("learn=('sink',) is MultiHeadAttention's (a sink per head); pass sink= to forward here")
        self._setup(mapping, dtype, learn, ranges, scores, 1, rng)
        bound = 1 / math.sqrt(dim)
        for name in ("Q", "K", "V"):
            self.params[name] = rng.uniform(-bound, bound, (dim, dim)).astype(self.dtype)

    def forward(self, x, *, mask=None, need_weights: bool = False, **constraints):
        """``Y`` for ``x`` of shape ``(..., l, d)``; ``need_weights=True`` keeps ``W`` in :attr:`attention_weights`.

        ``constraints``: a constraint set's keywords, as :func:`~numeric.attention.attention` takes them (the
        box's ``upper``, broadcasting to ``(..., l, l)``); :meth:`backward` differentiates at the same set (the
        layer gives no gradient in the set's arrays: :func:`~numeric.attention.attention_backward` does)."""
        xp, dt, (x,) = self._compute(x)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., length, {self.dim}), got {x.shape}")
        q, k, v = (x @ self._param(n, xp, dt) for n in ("Q", "K", "V"))
        kw = dict(mapping=self._map(xp, (1,)), mask=mask, causal=self.causal, scores=self._score_function(xp, dt),
                  **constraints)
        if need_weights:
            y, w = attention(q, k, v, return_weights=True, **kw)
        else:
            y, w = attention(q, k, v, **kw), None
        self._cache = (x, q, k, v, mask, y.shape, constraints)
        self.attention_weights = w
        return y

    def backward(self, dy):
        """``dx`` of ``sum(dy * y)`` for the last forward call; fills :attr:`grads`."""
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() first")
        x, q, k, v, mask, shape, constraints = self._cache
        xp = array_module(x)
        dy = xp.asarray(dy).astype(x.dtype, copy=False)
        _check_dy(dy, shape)
        kw = dict(mapping=self._map(xp, (1,)), mask=mask, causal=self.causal, scores=self._score_function(xp, x.dtype),
                  **constraints)
        if self._wants_param_grads:
            dq, dk, dv, found = attention_backward(q, k, v, dy, param_grads=True, **kw)
        else:
            (dq, dk, dv), found = attention_backward(q, k, v, dy, **kw), None
        flat = x.reshape(-1, self.dim)
        grads = {n: flat.T @ d.reshape(-1, self.dim) for n, d in (("Q", dq), ("K", dk), ("V", dv))}
        if found is not None:
            grads.update(self._extra_grads(found, xp))
        self._finish_grads(grads)
        return sum(d @ self._param(n, xp, x.dtype).T for n, d in (("Q", dq), ("K", dk), ("V", dv)))


class MultiHeadAttention(_Layer):
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
        Parameter dtype, a floating type (see the module's dtype policy).
    seed:
        Seed of the uniform(-1/sqrt(E), 1/sqrt(E)) initialisation.
    positional:
        ``None``, ``"sinusoidal"`` (added to the inputs) or ``"learned"``
        (a parameter ``positional`` of shape ``(max_len, E)``, added to the inputs).
    max_len:
        Longest sequence for ``positional="learned"``.
    learn, ranges:
        Map parameters learned per head, and their ranges (module docstring):
        ``MultiHeadAttention(64, 8, mapping=get_map("entmax", alpha=1.5), learn=("alpha",))``.
    scores:
        The score function of every head (:func:`numeric.attention`'s ``scores=``).

    Attributes
    ----------
    params, grads:
        ``q_weight``, ``k_weight``, ``v_weight``, ``out_weight`` ``(E, E)`` and
        (with ``bias``) ``q_bias``, ``k_bias``, ``v_bias``, ``out_bias`` ``(E,)``
        (and ``positional`` when learned, ``<name>_logit`` ``(H,)`` per learned
        map parameter, ``scores_<name>`` per score-function parameter).
    attention_weights:
        ``(N, H, L, S)`` weights of the last forward call, per head, if it was
        made with ``need_weights=True``; else ``None``.
    """

    _fields = ("embed_dim", "num_heads", "causal", "bias", "positional")

    def __init__(self, embed_dim: int, num_heads: int, *, mapping="softmax", causal: bool = False, bias: bool = True,
                 dtype="float32", seed=None, positional=None, max_len: int = 4096, learn=(), ranges=None, scores=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be positive, got {embed_dim}, {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads = {num_heads} does not divide embed_dim = {embed_dim}")
        if positional not in (None, "sinusoidal", "learned"):
            raise ValueError(f"positional must be None, 'sinusoidal' or 'learned', got {positional!r}")
        rng = np.random.default_rng(seed)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.causal, self.bias, self.positional = causal, bias, positional
        self._setup(mapping, dtype, learn, ranges, scores, num_heads, rng)
        bound = 1 / math.sqrt(embed_dim)
        for name in ("q", "k", "v", "out"):
            self.params[f"{name}_weight"] = rng.uniform(-bound, bound, (embed_dim, embed_dim)).astype(self.dtype)
        if bias:
            for name in ("q", "k", "v", "out"):
                self.params[f"{name}_bias"] = np.zeros(embed_dim, dtype=self.dtype)
        if positional == "learned":
            self.params["positional"] = (0.02 * rng.standard_normal((max_len, embed_dim))).astype(self.dtype)

    # ----------------------------------------------------------------- helpers
    def _project(self, x, name, xp):
        y = x @ self._param(f"{name}_weight", xp, x.dtype).T
        if self.bias:
            y = y + self._param(f"{name}_bias", xp, x.dtype)
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
        table = self._param("positional", xp, x.dtype)
        if length > table.shape[0]:
            raise ValueError(f"sequence length {length} exceeds max_len {table.shape[0]} of the learned encoding")
        return x + table[:length]

    def _attention_kwargs(self, xp, dtype, mask, constraints):
        if self.learn_sink:  # (one per head: (H,), numeric.plan.keyword_shape)
            if "sink" in constraints:
                raise ValueError("this layer learns its sinks (learn=('sink',)): pass no sink=")
            constraints = {**constraints, "sink": self._param("sink", xp, dtype)}
        return dict(mapping=self._map(xp, (self.num_heads, 1, 1)), mask=mask, causal=self.causal,
                    scores=self._score_function(xp, dtype), **constraints)

    # ----------------------------------------------------------------- forward
    def forward(self, query, key=None, value=None, *, mask=None, need_weights: bool = False, **constraints):
        """``(N, L, E)`` output for ``query (N, L, E)``, ``key (N, S, E)``, ``value (N, S, E)``.

        ``key`` defaults to ``query`` and ``value`` to ``key``.  ``mask``
        broadcasts to ``(N, H, L, S)`` (e.g. ``(L, S)`` or ``(N, 1, L, S)``).
        ``need_weights=True`` keeps the weights in :attr:`attention_weights`
        (``N H L S`` of memory, and the dense path); by default they are not
        kept (``None``) and long sequences go through the blocked paths.
        ``constraints``: a constraint set's keywords, as :func:`~numeric.attention.attention` takes them, arrays
        broadcasting to ``(N, H, L, S)`` like ``mask``; :meth:`backward` differentiates at the same set (no
        gradient in the set's arrays).
        """
        self_attn = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        same_kv = value is key
        xp, dt, (query, key, value) = self._compute(query, key, value)
        for name, a in (("query", query), ("key", key), ("value", value)):
            if a.ndim != 3 or a.shape[-1] != self.embed_dim:
                raise ValueError(f"{name} must have shape (N, length, {self.embed_dim}), got {a.shape}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"shapes do not match: query {query.shape}, key {key.shape}, value {value.shape}")
        xq, xk, xv = self._encode(query, xp), self._encode(key, xp), self._encode(value, xp)
        q = self._split(self._project(xq, "q", xp))
        k = self._split(self._project(xk, "k", xp))
        v = self._split(self._project(xv, "v", xp))
        kw = self._attention_kwargs(xp, dt, mask, constraints)
        if need_weights:
            heads, weights = attention(q, k, v, return_weights=True, **kw)
        else:
            heads, weights = attention(q, k, v, **kw), None
        merged = self._merge(heads)
        y = self._project(merged, "out", xp)
        self._cache = dict(xq=xq, xk=xk, xv=xv, q=q, k=k, v=v, merged=merged, mask=mask, self_attn=self_attn,
                           same_kv=same_kv, shape=y.shape, constraints=constraints)
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
        xp = array_module(c["merged"])
        dt = c["merged"].dtype
        dy = xp.asarray(dy).astype(dt, copy=False)
        _check_dy(dy, c["shape"])
        E = self.embed_dim
        grads = {}
        grads["out_weight"] = dy.reshape(-1, E).T @ c["merged"].reshape(-1, E)
        if self.bias:
            grads["out_bias"] = dy.reshape(-1, E).sum(axis=0)
        dmerged = dy @ self._param("out_weight", xp, dt)
        kw = self._attention_kwargs(xp, dt, c["mask"], c["constraints"])
        if self._wants_param_grads:
            dq, dk, dv, found = attention_backward(c["q"], c["k"], c["v"], self._split(dmerged), param_grads=True, **kw)
            grads.update(self._extra_grads(found, xp))
        else:
            dq, dk, dv = attention_backward(c["q"], c["k"], c["v"], self._split(dmerged), **kw)
        inputs = {}
        for name, d, x in (("q", dq, c["xq"]), ("k", dk, c["xk"]), ("v", dv, c["xv"])):
            d = self._merge(d)
            grads[f"{name}_weight"] = d.reshape(-1, E).T @ x.reshape(-1, E)
            if self.bias:
                grads[f"{name}_bias"] = d.reshape(-1, E).sum(axis=0)
            inputs[name] = d @ self._param(f"{name}_weight", xp, dt)
        if self.positional == "learned":
            table = xp.zeros(self.params["positional"].shape, dtype=dt)
            for name in ("q", "k", "v"):
                length = inputs[name].shape[1]
                table[:length] += inputs[name].sum(axis=0)
            grads["positional"] = table
        self._finish_grads(grads)
        if c["self_attn"]:
            return inputs["q"] + inputs["k"] + inputs["v"]
        return inputs["q"], inputs["k"], inputs["v"]
