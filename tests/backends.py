"""The array backends as a parametrisation of the tests: a property written once runs on every backend that has
the feature it needs.

:data:`BACKENDS` names each backend's :class:`Backend`; :func:`backend_params` gives them as pytest parameters
(``pytest.param(name, marks=...)``) for the features a test needs, and the ``backend`` fixture
(``tests/conftest.py``) builds the one a test is parametrised with, skipping it where its framework is not
installed.  Every backend works in float64 (JAX with ``jax_enable_x64`` inside :meth:`Backend.context`) and
in the layout ``(batch, heads, length, dim)`` for attention (JAX's own is ``(batch, length, heads, dim)``: its
backend transposes).

Features: ``"autodiff"`` (gradients of any composition: torch's autograd, ``jax.grad``), ``"forward"``
(forward-mode derivatives of any composition: ``jax.jvp``), ``"jit"`` (a traced call that compiles in a fraction of
a second: ``jax.jit``; ``torch.compile`` has tests of its own).  NumPy has none of them (its maps have ``vjp``,
``jvp`` and ``loss_and_grad``).  ``xp`` is the backend's array namespace (``numpy``,
``torch``, ``jax.numpy``) for the few operations a test composes itself.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import numeric as nm


class Backend:
    """One array backend's maps, losses and attention behind one set of calls (see the module)."""

    name = ""
    features: frozenset = frozenset()
    #: the backend's name for the axis a map runs along, as its messages say it
    axis_word = "axis"

    def context(self):
        return contextlib.nullcontext()

    def array(self, a, dtype=np.float64):
        raise NotImplementedError

    def numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def astype(self, a, dtype):
        """``a`` in the backend's ``dtype`` (``xp.float16``, ``torch.bfloat16``, ...)."""
        return a.astype(dtype)

    def get_map(self, name, **params):
        raise NotImplementedError

    def call(self, m, x, axis=-1, **keywords):
        return m(x, axis=axis, **keywords)

    def loss(self, m, x, target, axis=-1, reduction="mean", **constraints):
        raise NotImplementedError

    def attention(self, q, k, v, mapping, is_causal=False, mask=None, block=None, **keywords):
        """``(batch, heads, length, dim)`` arrays in and out; ``mask`` (boolean, ``True``: kept, or additive: 0 or
        ``-inf``) and ``keywords`` (a constraint set's, ``upper=``) broadcast to the scores ``(batch, heads, queries,
        keys)``; ``block``: the queries per block (the backend's keyword for it)."""
        raise NotImplementedError

    def grad(self, fn, *args, native: bool = False):
        """The gradient of the scalar ``fn(*args)`` in each of ``args``, as NumPy arrays (``native``: the backend's
        arrays, dtype kept): one array for one argument, a tuple for several (``"autodiff"``)."""
        raise NotImplementedError

    def jvp(self, fn, x, t):
        """``(fn(x), d fn(x) [t])`` as NumPy arrays (``"forward"``: forward-mode derivatives)."""
        raise NotImplementedError

    def check_grads(self, fn, *args, order: int = 2, atol=None, reverse_only: bool = False, eps=None) -> None:
        """``fn``'s derivatives at ``args`` (in every one of them) against finite differences, to ``order``
        (``"autodiff"``); ``atol``: the framework's default where ``None``; ``reverse_only``: the reverse mode
        alone where the framework has both (JAX: forward mode is checked elsewhere, and each mode compiles);
        ``eps``: the differences' step, the framework's default (torch 1e-6, JAX 1e-4) where ``None``."""
        raise NotImplementedError

    def jit(self, fn):
        """``fn`` traced and compiled (``"jit"``)."""
        raise NotImplementedError

    def hessian(self, fn, x) -> np.ndarray:
        """The Hessian of the scalar ``fn`` at the 1-D ``x`` (``"autodiff"``)."""
        raise NotImplementedError

    def jacobian(self, fn, x) -> np.ndarray:
        """The Jacobian of ``fn`` at the 1-D ``x``, ``d fn_i / d x_j`` (``"autodiff"``)."""
        raise NotImplementedError


class NumpyBackend(Backend):
    name = "numpy"
    xp = np

    def array(self, a, dtype=np.float64):
        return np.asarray(a, dtype=dtype) if np.asarray(a).dtype.kind == "f" else np.asarray(a)

    def get_map(self, name, **params):
        return nm.get_map(name, **params)

    def loss(self, m, x, target, axis=-1, reduction="mean", **constraints):
        return m.loss(x, target, axis=axis, reduction=reduction, **constraints)

    def attention(self, q, k, v, mapping, is_causal=False, mask=None, block=None, **keywords):
        return nm.attention(q, k, v, mapping=mapping, causal=is_causal, mask=mask, block=block, **keywords)


class TorchBackend(Backend):
    name = "torch"
    features = frozenset({"autodiff"})
    axis_word = "dim"

    def __init__(self):
        self.torch = self.xp = pytest.importorskip("torch")
        import numeric.torch as rt

        self.rt = rt

    def array(self, a, dtype=np.float64):
        a = np.array(a)  # (a copy, 0-d kept)
        return self.torch.from_numpy(a.astype(dtype) if a.dtype.kind == "f" else a)

    def numpy(self, a):
        return a.detach().numpy() if isinstance(a, self.torch.Tensor) else np.asarray(a)

    def astype(self, a, dtype):
        return a.to(dtype)

    def get_map(self, name, **params):
        return self.rt.get_map(name, **params)

    def call(self, m, x, axis=-1, **keywords):
        return m(x, dim=axis, **keywords)

    def loss(self, m, x, target, axis=-1, reduction="mean", **constraints):
        return self.rt.fenchel_young_loss(x, target, m, reduction, dim=axis, **constraints)

    def attention(self, q, k, v, mapping, is_causal=False, mask=None, block=None, **keywords):
        return self.rt.attention(q, k, v, mask, mapping=mapping, is_causal=is_causal, block=block, **keywords)

    def grad(self, fn, *args, native=False):
        args = tuple(a.detach().clone().requires_grad_() for a in args)
        grads = tuple(g if native else g.numpy() for g in self.torch.autograd.grad(fn(*args), args))
        return grads[0] if len(args) == 1 else grads

    def check_grads(self, fn, *args, order=2, atol=None, reverse_only=False, eps=None):
        args = tuple(a.detach().clone().requires_grad_() for a in args)
        tol = {k: v for k, v in (("atol", atol), ("eps", eps)) if v is not None}
        assert self.torch.autograd.gradcheck(fn, args, **tol)
        if order >= 2:
            assert self.torch.autograd.gradgradcheck(fn, args, **tol)

    def hessian(self, fn, x):
        return self.torch.autograd.functional.hessian(fn, x).numpy()

    def jacobian(self, fn, x):
        return self.torch.autograd.functional.jacobian(fn, x).numpy()


class JaxBackend(Backend):
    name = "jax"
    features = frozenset({"autodiff", "jit", "forward"})

    def __init__(self):
        self.jax = pytest.importorskip("jax")
        import jax.numpy as jnp

        import numeric.jax as rj

        self.jnp = self.xp = jnp
        self.rj = rj

    def context(self):
        return self.jax.enable_x64(True)

    def array(self, a, dtype=np.float64):
        a = np.asarray(a)
        return self.jnp.asarray(a.astype(dtype) if a.dtype.kind == "f" else a)

    def get_map(self, name, **params):
        return self.rj.get_map(name, **params)

    def loss(self, m, x, target, axis=-1, reduction="mean", **constraints):
        return self.rj.fenchel_young_loss(x, target, m, reduction, axis=axis, **constraints)

    def attention(self, q, k, v, mapping, is_causal=False, mask=None, block=None, **keywords):
        t = (lambda a: self.jnp.swapaxes(a, 1, 2))
        if mask is not None and mask.dtype != bool:  # (JAX's additive mask is its bias)
            keywords["bias"], mask = mask, None
        return t(self.rj.attention(t(q), t(k), t(v), mask=mask, mapping=mapping, is_causal=is_causal,
                                   block_size=block, **keywords))

    def grad(self, fn, *args, native=False):
        grads = self.jax.grad(fn, argnums=tuple(range(len(args))))(*args)
        grads = grads if native else tuple(np.asarray(g) for g in grads)
        return grads[0] if len(args) == 1 else tuple(grads)

    def jvp(self, fn, x, t):
        p, dp = self.jax.jvp(fn, (x,), (t,))
        return np.asarray(p), np.asarray(dp)

    def jit(self, fn):
        return self.jax.jit(fn)

    def hessian(self, fn, x):
        return np.asarray(self.jax.hessian(fn)(x))

    def jacobian(self, fn, x):
        return np.asarray(self.jax.jacobian(fn)(x))

    def check_grads(self, fn, *args, order=2, atol=None, reverse_only=False, eps=None):
        from jax.test_util import check_grads

        check_grads(fn, args, order=order, modes=["rev"] if reverse_only else ["fwd", "rev"], atol=atol, eps=eps)


BACKENDS = {"numpy": NumpyBackend, "torch": TorchBackend, "jax": JaxBackend}


def backend_params(*features: str, only=None):
    """The backends (names, as pytest parameters) that have every one of ``features``, of ``only`` where given."""
    names = [name for name, cls in BACKENDS.items() if set(features) <= cls.features and (only is None or name in only)]
    return [pytest.param(name, id=name) for name in names]
