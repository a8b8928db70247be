"""The NumPy backend: maps on NumPy arrays, row by row.

Rows are solved by :func:`numeric.core.rules.solve`, the text torch and JAX
run, on :class:`numeric.numpy.ops.NumpyRowOps`, with NumPy's own forms of whole
steps (:mod:`numeric.numpy.steps`: no shift for a closed threshold where none is
needed, sort thresholds from the largest scores or over one scratch buffer,
writes into the output).  Large
inputs are cut into chunks of rows solved side by side (:func:`_on_two_threads`).
The JVP is ``w*v - w (w.v)/sum(w)`` with ``w = w(p)`` on the support.

A continuous map's basis expectations (:meth:`NumpyBackend.rbf_expectation`)
come from the generated closed forms in float64, and from Gauss-Legendre sums
over the support (:func:`_quadrature`) where the closed form cancels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import contract
from ..backend import Backend, at_zero
from ..core import derivatives
from ..core.ops import Routines
from ..parallel import run_tasks
from . import steps
from .ops import ops_for

__all__ = ["NumpyBackend", "THREADS_FROM", "CHUNKS"]


#: NumPy inputs of at least this many scores are solved in chunks of rows, on several threads where allowed.
THREADS_FROM = 1 << 17
#: Number of chunks of rows (so at most this many threads work on one input).
CHUNKS = 2


def _on_two_threads(solve, rows: int, size: int, chunks: int | None = None) -> None:
    """``solve(lo, hi)`` over the rows ``[0, rows)``: in ``CHUNKS`` chunks from :data:`THREADS_FROM` scores.

    NumPy's ufuncs and einsum release the GIL, so chunks run side by side on the
    threads of :func:`numeric.parallel.run_tasks`: the caller's and pool threads,
    at most one per chunk and :func:`numeric.get_num_threads` in all, and only the
    caller's inside a task that already runs on the pool (attention's heads).
    The chunks depend only on the sizes, not on the thread count, so the rows
    come out the same however many threads take them.  The caller's NumPy error
    state travels with the chunks.
    """
    if size < THREADS_FROM or rows < 2:
        solve(0, rows)
        return
    chunks = min(rows, chunks or CHUNKS)
    bounds = [rows * i // chunks for i in range(chunks + 1)]
    run_tasks(lambda i: solve(bounds[i], bounds[i + 1]), chunks)


class NumpyBackend(Backend):
    """Maps on NumPy arrays (the reference backend: every other one is tested against it)."""

    name = "numpy"

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def namespace(self):
        return np

    def shares_memory(self, a, b) -> bool:
        return np.may_share_memory(a, b)

    def forward(self, mapping, x: np.ndarray, *, overwrite: bool = False):
        """``(p, tau)`` for the rows of ``x`` (2-D, C-contiguous); ``overwrite`` lets ``p`` take ``x``'s memory."""
        params = mapping.cast_params(x.dtype)
        out = x if overwrite else np.empty_like(x)
        tau = np.empty(x.shape[0], dtype=x.dtype)

        def solve(lo, hi):
            self._forward_block(mapping.module, mapping.threshold, x[lo:hi], out[lo:hi], tau[lo:hi], params)

        _on_two_threads(solve, x.shape[0], x.size)
        return out, tau

    def _forward_block(self, module, kind: str, x: np.ndarray, out: np.ndarray, tau: np.ndarray, params: tuple):
        """``p`` of the rows ``x`` into ``out`` (which may be ``x`` itself) and their thresholds into ``tau``:
        :func:`numeric.numpy.steps.solve` (:func:`numeric.core.rules.solve` with NumPy's own steps) on
        :class:`numeric.numpy.ops.NumpyRowOps`."""
        ops = ops_for(x.dtype)
        routines = Routines(module, contract.module_routines(module), params)
        method = "auto" if kind == module.THRESHOLD else kind
        with np.errstate(all="ignore"):  # off-support branches are evaluated and masked
            _, t = steps.solve(ops, routines, x, method=method, out=out)  # (p in out)
            tau[...] = t[:, 0]

    def closed_with(self, mapping, x: np.ndarray, column: np.ndarray):
        """:func:`numeric.numpy.steps.closed_unshifted` with the column's term in the row sums."""
        module = mapping.module
        routines = Routines(module, contract.module_routines(module), mapping.cast_params(x.dtype))
        with np.errstate(all="ignore"):  # off-support branches are evaluated and masked
            p, t = steps.closed_unshifted(ops_for(x.dtype), routines, x, extra=column)
        return p, t[:, 0]

    def jvp(self, mapping, y: np.ndarray, dx: np.ndarray) -> np.ndarray:
        """``J dx`` along the last axis at ``y = m(x)``: :func:`numeric.core.derivatives.jvp` on
        :class:`numeric.numpy.ops.NumpyRowOps`, ``w*dx - w (w.dx) / sum(w)``, ``w = w(y)`` on the support."""
        module = mapping.module
        routines = Routines(module, contract.module_routines(module), mapping.cast_params(y.dtype))
        with np.errstate(all="ignore"):  # off-support branches are evaluated and masked
            return derivatives.jvp(ops_for(y.dtype), routines, y, dx, at_zero(module))

    def row_ops(self, dtype):
        """:class:`numeric.numpy.ops.NumpyRowOps`: the generic operations with NumPy's faster forms of some steps."""
        return ops_for(dtype)

    def rbf_expectation(self, cmap, mu: np.ndarray, sigma2: np.ndarray, basis, grad: bool):
        """``(r, dr/dmu, dr/dsigma2)`` (the derivatives ``None`` when ``grad=False``) for float64 ``mu``, ``sigma2``
        of one shape: the closed form where it is accurate, Gauss-Legendre (:func:`_quadrature`) where it cancels."""
        module = cmap.module
        m, v = mu[..., None], sigma2[..., None]
        rules = _quadrature_rules(module)
        if rules is None:
            if grad:
                return module.rbf_expectation_grad(m, v, basis.centers, basis.variances)
            return module.rbf_expectation(m, v, basis.centers, basis.variances), None, None
        return _expectation_mixed(module, rules, m, v, basis, grad)


def _expectation_mixed(mod, rules, m, v, basis, grad):
    """The closed form where it is accurate, Gauss-Legendre (:func:`_quadrature`) where it cancels."""
    shape = np.broadcast_shapes(m.shape, basis.centers.shape)
    m, v, c, s2 = (np.broadcast_to(x, shape).ravel() for x in (m, v, basis.centers, basis.variances))
    a = mod.support_radius(v)
    gamma = (a * np.abs(c - m) + a * a / 2) / s2
    rule = np.searchsorted(rules.gamma, gamma)  # the first rule whose gamma covers it
    quad = (a < mod.QUADRATURE_BELOW * np.sqrt(s2)) & (rule < len(rules.counts))
    outs = [np.empty(m.size) for _ in range(3 if grad else 1)]
    closed = ~quad
    if closed.any():
        args = (m[closed], v[closed], c[closed], s2[closed])
        parts = mod.rbf_expectation_grad(*args) if grad else (mod.rbf_expectation(*args),)
        for out, part in zip(outs, parts):
            out[closed] = part
    for k in np.unique(rule[quad]):
        sel = quad & (rule == k)
        parts = _quadrature(mod, rules.nodes[k], rules.weights[k], m[sel], v[sel], c[sel], s2[sel], grad)
        for out, part in zip(outs, parts):
            out[sel] = part
    outs = [out.reshape(shape) for out in outs]
    return tuple(outs) if grad else (outs[0], None, None)


@dataclass(frozen=True)
class _Rules:
    """A module's Gauss-Legendre rules: node counts, the float64 ``gamma`` each serves, halved nodes and weights."""

    counts: tuple
    gamma: np.ndarray
    nodes: tuple
    weights: tuple


@lru_cache(maxsize=None)
def _quadrature_rules(module) -> _Rules | None:
    """A continuous module's quadrature rules, or ``None`` when it has none (closed form everywhere)."""
    rules = getattr(module, "QUADRATURE_RULES", ())
    if not rules or getattr(module, "SHAPE", None) is None or not getattr(module, "QUADRATURE_BELOW", 0.0) > 0:
        return None
    return _Rules(tuple(r[0] for r in rules), np.array([r[1] for r in rules]),
                  tuple(np.array(r[3]) for r in rules), tuple(np.array(r[4]) for r in rules))


def _quadrature(module, nodes, weights, m, v, c, s2, grad):
    """``(E,)`` or ``(E, dE/dmu, dE/dsigma2)`` by the Gauss-Legendre rule ``(nodes, weights)`` (halved) on the support.

    With ``u = a x``, ``d = c - mu``, ``h = u^2 / (2 s2)``, ``y = d u / s2`` and
    ``psi(mu + u) = phi0 exp(y - h)`` (``phi0 = N(c; mu, s2)``), pairing the nodes ``+-x``
    of the even shape ``P``:

    * ``E = phi0 (1 + sum w P (expm1(-h) cosh y + 2 sinh^2(y / 2)))``, the 1 being ``int P``;
    * ``dE/dmu = phi0 (d / s2) (E / phi0 - (a^2 / s2) S1)``;
    * ``dE/dsigma2 = a'(sigma2) phi0 (a / s2) ((d^2 / s2) S1 - C2)``,

    ``S1 = sum w P x^2 e^(-h) sinh(y) / y`` and ``C2 = sum w P x^2 e^(-h) cosh y``.  No
    term is large next to the result, so only what the exact values cancel cancels.
    """
    a = module.support_radius(v)
    d = c - m
    x = nodes[None, :]
    shape = np.polynomial.polynomial.polyval(nodes, np.array(module.SHAPE))[None, :] * weights[None, :]
    u = a[:, None] * x
    h = u * u / (2 * s2[:, None])
    y = d[:, None] * u / s2[:, None]
    ch = np.cosh(y)
    half = np.sinh(y / 2)
    b0 = 1 + (shape * (np.expm1(-h) * ch + 2 * half * half)).sum(axis=1)
    phi0 = np.exp(-d * d / (2 * s2)) / np.sqrt(2 * math.pi * s2)
    if not grad:
        return (phi0 * b0,)
    eh = np.exp(-h)
    with np.errstate(invalid="ignore", divide="ignore"):
        sinhc = np.where(y == 0, 1.0, np.sinh(y) / y)
    s1 = (shape * x * x * eh * sinhc).sum(axis=1)
    c2 = (shape * x * x * eh * ch).sum(axis=1)
    dmu = phi0 * (d / s2) * (b0 - a * a / s2 * s1)
    dvar = module.support_radius_dsigma2(v) * phi0 * (a / s2) * (d * d / s2 * s1 - c2)
    return phi0 * b0, dmu, dvar
