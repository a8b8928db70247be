"""The operations of :mod:`numeric.core` and :func:`numeric.newton.invert_link` on JAX arrays.

:class:`JaxOps` implements :class:`numeric.core.ops.TensorOps` for one
floating dtype with :mod:`jax.numpy` and :mod:`jax.lax`, so the rules trace
under ``jax.jit`` and ``jax.vmap``: ``repeat`` is a :func:`jax.lax.while_loop`
that stops when no row is still going (or after its budget), ``branch`` a
:func:`jax.lax.cond` on whether any row asks for the computation (under
``vmap`` with a batched predicate JAX evaluates both sides and selects).
Reductions run along the last axis keeping it.

The loop's and the branches' results are cast to the types of their inputs
(JAX requires identical types; a Python number in a ``where`` may give a
weakly typed array).
"""

from __future__ import annotations

import math
from functools import lru_cache

import jax
import jax.numpy as jnp
from jax import lax

from ..newton import NEWTON_STEPS
from ..core.ops import TensorOps

__all__ = ["JaxOps", "ops_for", "ON_ROWS_CHUNK"]

#: The rows :meth:`JaxOps.on_rows` computes at a time.
ON_ROWS_CHUNK = 32


def _strong(a, dtype=None):
    """``a`` as a strongly typed array of ``dtype`` (its own by default)."""
    a = jnp.asarray(a)
    return lax.convert_element_type(a, a.dtype if dtype is None else dtype)


def _like(new, old):
    """``new`` strongly typed in the dtype of ``old`` (an array or a ``ShapeDtypeStruct``)."""
    return _strong(new, old.dtype)


class JaxOps(TensorOps):
    """:class:`~numeric.core.ops.TensorOps` on JAX arrays of ``dtype`` (traceable: no value reaches Python)."""

    def __init__(self, dtype):
        info = jnp.finfo(dtype)
        self.dtype = jnp.dtype(dtype)
        self.eps = float(info.eps)
        self.tiny = float(info.tiny)
        self.log_tiny = math.log(float(info.tiny))
        self.newton_steps = NEWTON_STEPS

    def full(self, like, value):
        if isinstance(value, bool):
            return jnp.full(jnp.shape(like), value, dtype=bool)
        return jnp.full(jnp.shape(like), value, dtype=self.dtype)

    def float_(self, b):
        return b.astype(self.dtype)

    @staticmethod
    def pos_part(x):
        return jnp.maximum(x, 0)  # -inf to 0, NaN stays NaN

    support = staticmethod(jnp.sign)  # (on u >= 0)

    @staticmethod
    def clamp_min(x, v):
        return jnp.maximum(x, v)

    exp = staticmethod(jnp.exp)
    log = staticmethod(jnp.log)
    isfinite = staticmethod(jnp.isfinite)
    isnan = staticmethod(jnp.isnan)
    not_ = staticmethod(jnp.logical_not)

    @staticmethod
    def where(cond, a, b):
        return jnp.where(cond, a, b)

    @staticmethod
    def row_sum(x):
        return jnp.sum(x, axis=-1, keepdims=True)

    @staticmethod
    def cat(a, b):
        return jnp.concatenate((a, b), axis=-1)

    @staticmethod
    def row_max(x):
        return jnp.max(x, axis=-1, keepdims=True)  # NaN where the row has one

    @staticmethod
    def sort_desc(x):
        return jnp.flip(jnp.sort(x, axis=-1), axis=-1)

    @staticmethod
    def cumsum(x):
        return jnp.cumsum(x, axis=-1)

    @staticmethod
    def top(x, k):
        return lax.top_k(x, k)

    @staticmethod
    def above(x, cut, k):
        keep = x > cut
        slot = jnp.minimum(jnp.where(keep, jnp.cumsum(keep, axis=-1) - 1, k), k)
        rows, n = jnp.arange(x.shape[0])[:, None], x.shape[-1]
        values = jnp.full((x.shape[0], k + 1), -jnp.inf, x.dtype).at[rows, slot].set(x)
        columns = jnp.arange(n)
        index = jnp.full((x.shape[0], k + 1), n, columns.dtype).at[rows, slot].set(jnp.broadcast_to(columns, x.shape))
        return values[:, :k], index[:, :k]

    @staticmethod
    def at_place(x, k):
        return jnp.take_along_axis(x, k.astype(jnp.int32) - 1, axis=-1)

    @staticmethod
    def put(values, index, like):
        n = like.shape[-1]
        out = jnp.zeros((*like.shape[:-1], n + 1), values.dtype)
        return jnp.put_along_axis(out, index, values, axis=-1, inplace=False)[..., :n]

    @staticmethod
    def int_max(x):
        return None  # (traced under jit: shapes cannot depend on values)

    @staticmethod
    def repeat(n, body, state, going):
        def cond(carry):
            i, _, going = carry
            return (i < n) & jnp.any(going)

        def step(carry):
            i, state, _ = carry
            new, going = body(state)
            return i + 1, jax.tree.map(_like, new, state), jnp.asarray(going, bool)

        state = jax.tree.map(_strong, state)
        _, state, _ = lax.while_loop(cond, step, (jnp.asarray(0, jnp.int32), state, jnp.asarray(going, bool)))
        return state

    gathers_tail = True

    @staticmethod
    def take_rows(a, index):
        return a[index]

    @staticmethod
    def put_rows(a, index, b):
        return a.at[index].set(b.astype(a.dtype))

    @staticmethod
    def first_rows(mask, size):
        return jnp.argsort(jnp.logical_not(mask.reshape(-1)), stable=True)[:size]

    @staticmethod
    def count_true(mask):
        return jnp.sum(mask.astype(jnp.int32))

    @property
    def candidates_from(self):
        # on the CPU, gini_log1p's (512, n) float32 rows under jit: whole rows 3.1x entmax15's time at n = 64,
        # 3.8x at 256, 4.2x at 512, 6.4x at 1024; candidates first 4.9x, 9.2x, 7.2x and 5.3x (and at n = 64 the
        # candidates above a cut, TensorOps.cut_up_to, instead of top_k: cosh_one 3.6x -> 5.0x, gini_cubic 2.1x ->
        # 3.7x, so cut_up_to stays 0)
        return 1024 if jax.default_backend() == "cpu" else 0

    @staticmethod
    def rare(pred, fn, otherwise):
        return fn()  # (elementwise work fuses under jit: a cond would cost more than the masking it saves)

    @staticmethod
    def branch(pred, fn, otherwise):
        shapes = jax.eval_shape(otherwise)
        return lax.cond(jnp.any(pred), lambda: jax.tree.map(_like, fn(), shapes),
                        lambda: jax.tree.map(_like, otherwise(), shapes))

    def on_rows(self, mask, fn, rows, otherwise):
        """``fn`` on the masked rows only, :data:`ON_ROWS_CHUNK` at a time (a ``while_loop`` over chunks of the
        masked rows gathered first; none runs where no row is masked).

        Computing ``fn`` on every row and selecting costs the work of all rows where one asks, and its
        temporaries are allocated at every call even where none does: XLA on the CPU allocates the whole
        program's temporaries per call, and above glibc's largest heap allocation (32 MB) each call maps fresh
        pages (the KKT solve's fallback on (512, 1024) float32 rows: 36 MB, 10.4 ms a call where the solve
        itself takes 4.7).
        """
        count_rows = mask.shape[0]
        size = ON_ROWS_CHUNK
        if count_rows <= size:
            return TensorOps.on_rows(self, mask, fn, rows, otherwise)
        flat = mask.reshape(-1)
        shapes = jax.eval_shape(lambda: otherwise)

        def chunks():
            order = jnp.argsort(jnp.logical_not(flat), stable=True)  # the masked rows first
            count = jnp.sum(flat.astype(jnp.int32))

            def chunk(state):
                i, out = state
                start = jnp.minimum(i * size, count_rows - size)  # (a last chunk overlapping the one before: the same rows again)
                index = lax.dynamic_slice(order, (start,), (size,))
                picked = tuple(v[index] if getattr(v, "ndim", 0) and v.shape[0] == count_rows else v for v in rows)
                new = jax.tree.map(_like, fn(*picked), shapes)
                valid = (start + jnp.arange(size) < count)[:, None]
                return i + 1, out.at[index].set(jnp.where(valid, new, out[index]))

            return lax.while_loop(lambda state: state[0] * size < count, chunk, (jnp.asarray(0, jnp.int32), otherwise))[1]

        return lax.cond(jnp.any(flat), chunks, lambda: otherwise)


def ops_for(dtype) -> JaxOps:
    """The (cached) :class:`JaxOps` of a floating dtype."""
    return _ops(jnp.dtype(dtype))


_ops = lru_cache(maxsize=None)(JaxOps)
