"""Continuous attention: a density over positions ``t in [0, 1]`` in place of weights over tokens.

After Martins et al., "Sparse and continuous attention mechanisms" (NeurIPS 2020).
For scores ``f(t) = theta_1 t + theta_2 t^2`` the regularized argmax over densities
is a Gaussian ``N(mu, sigma2)`` (Shannon), a truncated parabola (continuous
sparsemax: support ``|t - mu| < (3 sigma2 / 2)^(1/3)``) or a biweight (1.5-entmax),
with ``mu = -theta_1 / (2 theta_2)`` and ``sigma2 = -1 / (2 theta_2)``; the modules
``numeric._generated.continuous_*`` hold the closed forms, derived by
:mod:`derive.continuous` and written by ``regattn generate``.

The sequence ``V`` (``L`` rows at positions ``t_l = (l + 1/2) / L``) becomes a
value function ``V(t) = B psi(t)`` over ``N`` Gaussian basis functions
``psi_j = N(t; c_j, s2_j)`` by ridge regression,
``B = V^T F^T (F F^T + lambda I)^{-1}`` with ``F_jl = psi_j(t_l)``, and the
context is ``E_p[V(t)] = B E_p[psi(t)]``: with ``G = F^T (F F^T + lambda I)^{-1}``
(``L x N``) it is ``(G r)^T V`` for ``r = E_p[psi(t)]``, so ``G r`` plays the
part of the attention weights over the ``L`` positions.

* :func:`get_continuous_map` loads a generated continuous map;
* :class:`GaussianBasis` holds ``c`` and ``s2``;
* :func:`continuous_attention` and :func:`continuous_attention_backward` map
  ``(values, mu, sigma2)`` to the context and back;
* :class:`ContinuousAttention` is a layer computing ``mu`` and ``sigma2`` from the
  data (the mean and variance of a discrete softmax over positions, scored by a
  learned query) and attending continuously to projected values.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from . import _generated
from . import contract
from .backend import array_module
from .backends import backend_for
from .layers import Movable
from .maps import get_map

__all__ = [
    "ContinuousMap",
    "get_continuous_map",
    "GaussianBasis",
    "positions",
    "continuous_attention",
    "continuous_attention_backward",
    "ContinuousAttention",
]


def positions(length: int) -> np.ndarray:
    """The positions ``t_l = (l + 1/2) / L`` of a sequence of ``L`` items in ``[0, 1]`` (float64)."""
    if length <= 0:
        raise ValueError(f"a sequence needs a positive length, got {length}")
    return (np.arange(length) + 0.5) / length


@dataclass(frozen=True)
class GaussianBasis:
    """Gaussian basis functions ``psi_j(t) = N(t; c_j, s2_j)`` on ``[0, 1]``.

    Attributes
    ----------
    centers, variances:
        Arrays of ``N`` centres ``c_j`` and variances ``s2_j > 0`` (float64).
    """

    centers: np.ndarray
    variances: np.ndarray

    def __post_init__(self):
        c = np.asarray(self.centers, dtype=np.float64).ravel()
        s2 = np.asarray(self.variances, dtype=np.float64).ravel()
        if c.shape != s2.shape or c.size == 0:
            raise ValueError(f"need as many centres as variances, at least one: got {c.shape} and {s2.shape}")
        if not (np.all(np.isfinite(c)) and np.all(s2 > 0) and np.all(np.isfinite(s2))):
            raise ValueError("basis centres must be finite and variances finite and positive")
        object.__setattr__(self, "centers", c)
        object.__setattr__(self, "variances", s2)

    @classmethod
    def uniform(cls, num_basis: int, widths=(0.1, 0.5)) -> GaussianBasis:
        """``num_basis`` functions: for each standard deviation in ``widths``, centres evenly over ``[0, 1]``.

        ``num_basis`` must be a multiple of ``len(widths)``.
        """
        widths = tuple(float(w) for w in widths)
        if num_basis <= 0 or num_basis % len(widths):
            raise ValueError(f"num_basis must be a positive multiple of {len(widths)} (one group per width), got {num_basis}")
        per = num_basis // len(widths)
        centers = np.tile(np.linspace(0, 1, per) if per > 1 else np.array([0.5]), len(widths))
        variances = np.repeat(np.array(widths) ** 2, per)
        return cls(centers, variances)

    def __len__(self) -> int:
        return self.centers.size

    def __call__(self, t) -> np.ndarray:
        """``psi(t)``: shape ``t.shape + (N,)``."""
        t = np.asarray(t, dtype=np.float64)[..., None]
        return np.exp(-((t - self.centers) ** 2) / (2 * self.variances)) / np.sqrt(2 * math.pi * self.variances)

    def __hash__(self):
        return hash((self.centers.tobytes(), self.variances.tobytes()))

    def __eq__(self, other):
        return (isinstance(other, GaussianBasis) and np.array_equal(self.centers, other.centers)
                and np.array_equal(self.variances, other.variances))


class ContinuousMap:
    """A generated continuous map: its density and the basis expectations the context needs.

    ``mu`` and ``sigma2`` broadcast against each other; results gain a last axis
    of the basis size.  The backend of the arrays
    (:func:`numeric.backends.backend_for`) computes the expectations: NumPy
    evaluates the generated closed forms in float64
    (:meth:`numeric.numpy.backend.NumpyBackend.rbf_expectation`); CuPy runs the
    generated ``rbf_context`` kernel, which makes the same choices.

    For a truncated polynomial ``p(u) = P(u / a) / a`` the closed form cancels
    where the support is narrow next to a basis function (relative to ``1 / s``,
    an error of about ``eps ((8 s + a) / a)^D (s / a) / 2`` for ``P`` of degree
    ``D``); where ``a < QUADRATURE_BELOW s`` the expectation and its derivatives
    are Gauss-Legendre sums over the support instead (``numeric.numpy.backend._quadrature``), with
    the number of nodes the module's error bound asks for given
    ``gamma = (a |c - mu| + a^2 / 2) / s^2``, how far ``log psi`` bends across the support.
    """

    def __init__(self, module: ModuleType):
        contract.check_continuous_module(module)
        self.module = module
        self.name = module.NAME
        self.family = module.FAMILY

    def __repr__(self) -> str:
        return f"ContinuousMap({self.name!r}, {self.family})"

    def density(self, t, mu, sigma2):
        """``p(t)`` for the density with mean ``mu`` and variance parameter ``sigma2``."""
        return self.module.density(t, mu, sigma2)

    def support(self, mu, sigma2):
        """``(lo, hi)``: the support ``[mu - a, mu + a]`` (``-inf, inf`` for the Gaussian)."""
        a = self.module.support_radius(np.asarray(sigma2, dtype=np.float64))
        return mu - a, mu + a

    def _check(self, mu, sigma2, xp):
        mu = xp.asarray(mu, dtype=np.float64)
        sigma2 = xp.asarray(sigma2, dtype=np.float64)
        if not bool(xp.all(sigma2 > 0)):
            raise ValueError(f"sigma2 must be positive, got min {float(sigma2.min())}")
        return xp.broadcast_arrays(mu, sigma2)

    def expectation(self, mu, sigma2, basis: GaussianBasis):
        """``r = E_p[psi(t)]``, shape ``broadcast(mu, sigma2).shape + (N,)``, float64."""
        return self.expectation_grad(mu, sigma2, basis, grad=False)[0]

    def expectation_grad(self, mu, sigma2, basis: GaussianBasis, *, grad: bool = True):
        """``(r, dr/dmu, dr/dsigma2)`` (the derivatives ``None`` when ``grad=False``)."""
        backend = backend_for(mu, sigma2)
        mu, sigma2 = self._check(mu, sigma2, backend.namespace())
        return backend.rbf_expectation(self, mu, sigma2, basis, grad)


# short names of the generated continuous built-ins (continuous_NAME), and "gaussian" for softmax's
_NAMES = {name[len("continuous_"):]: name for name in _generated.CONTINUOUS} | {"gaussian": "continuous_softmax"}


def get_continuous_map(name) -> ContinuousMap:
    """The continuous map for ``"softmax"`` (Gaussian), ``"sparsemax"`` (truncated parabola),
    ``"entmax15"`` (biweight), a generated module's full name, or the module itself.

    >>> import numeric.continuous as nc
    >>> m = nc.get_continuous_map("sparsemax")
    >>> [round(float(x), 4) for x in m.support(0.5, 0.01)]
    [0.2534, 0.7466]
    """
    if isinstance(name, ContinuousMap):
        return name
    if isinstance(name, ModuleType):
        return ContinuousMap(name)
    if not isinstance(name, str):
        raise TypeError(f"get_continuous_map expects a name or a generated module, got {type(name).__name__}")
    from ._generated import CONTINUOUS

    full = _NAMES.get(name, name)
    if full in CONTINUOUS:
        return ContinuousMap(importlib.import_module(f"numeric._generated.{full}"))
    try:
        return ContinuousMap(importlib.import_module(full))
    except ImportError:
        raise ValueError(f"no continuous map named {name!r}: built-ins are {', '.join(sorted(_NAMES))}") from None


_READOUT_CACHE: dict = {}


def readout(length: int, basis: GaussianBasis, ridge: float) -> np.ndarray:
    """``G = F^T (F F^T + ridge I)^{-1}`` (``L x N``, float64): context weights over positions are ``G r``."""
    if not ridge > 0:
        raise ValueError(f"ridge must be positive, got {ridge}")
    key = (length, hash(basis), float(ridge))
    if key not in _READOUT_CACHE:
        F = basis(positions(length)).T  # (N, L)
        gram = F @ F.T + ridge * np.eye(len(basis))
        G = np.linalg.solve(gram, F).T  # gram is symmetric: (gram^{-1} F)^T = F^T gram^{-1}
        if len(_READOUT_CACHE) > 64:
            _READOUT_CACHE.clear()
        _READOUT_CACHE[key] = G
    return _READOUT_CACHE[key]


def _setup(values, mu, sigma2, mapping, basis, ridge):
    xp = array_module(values, mu, sigma2)
    values = xp.asarray(values)
    if values.ndim < 2:
        raise ValueError(f"values must have shape (..., L, d), got {values.shape}")
    if values.dtype.kind != "f":
        values = values.astype(np.float64)
    cmap = get_continuous_map(mapping)
    basis = basis if basis is not None else GaussianBasis.uniform(32)
    batch = values.shape[:-2]
    mu, sigma2 = xp.asarray(mu, dtype=np.float64), xp.asarray(sigma2, dtype=np.float64)
    if mu.shape != batch or sigma2.shape != batch:
        raise ValueError(f"mu and sigma2 must have the batch shape {batch} of values {values.shape}, got {mu.shape} and {sigma2.shape}")
    G = xp.asarray(readout(values.shape[-2], basis, ridge))
    return xp, values, cmap, basis, mu, sigma2, G


def continuous_attention(values, mu, sigma2, *, mapping="softmax", basis: GaussianBasis | None = None,
                         ridge: float = 1e-3, return_weights: bool = False):
    """The context ``E_p[V(t)]`` of ``values`` under the continuous density of ``(mu, sigma2)``.

    Parameters
    ----------
    values:
        ``(..., L, d)``: ``L`` items at positions ``t_l = (l + 1/2) / L``.
    mu, sigma2:
        ``(...)``: the density's location and variance parameter (``sigma2 > 0``;
        for the compact maps the support is ``|t - mu| < a(sigma2)``).
    mapping:
        ``"softmax"`` (Gaussian), ``"sparsemax"``, ``"entmax15"`` or a generated
        continuous module.
    basis:
        The Gaussian basis of the value function (default:
        ``GaussianBasis.uniform(32)``: 16 centres at each of the widths 0.1 and 0.5).
    ridge:
        The ridge penalty ``lambda`` of the regression of ``values`` on the basis.
    return_weights:
        Also return the weights ``G r`` over the ``L`` positions (``(..., L)``).

    Returns
    -------
    ``(..., d)`` in the dtype of ``values`` (and the weights, float64).
    """
    xp, values, cmap, basis, mu, sigma2, G = _setup(values, mu, sigma2, mapping, basis, ridge)
    r = cmap.expectation(mu, sigma2, basis)
    weights = r @ G.T  # (..., L)
    out = (weights.astype(values.dtype)[..., None, :] @ values)[..., 0, :]
    return (out, weights) if return_weights else out


def continuous_attention_backward(values, mu, sigma2, dout, *, mapping="softmax", basis: GaussianBasis | None = None,
                                  ridge: float = 1e-3):
    """``(dvalues, dmu, dsigma2)`` for the loss gradient ``dout`` (``(..., d)``) of :func:`continuous_attention`.

    ``dvalues = w dout^T`` with ``w = G r``; ``dr = G^T (values dout)``;
    ``dmu = dr . dr/dmu`` and ``dsigma2 = dr . dr/dsigma2`` through the generated
    derivatives of the closed-form expectation.
    """
    xp, values, cmap, basis, mu, sigma2, G = _setup(values, mu, sigma2, mapping, basis, ridge)
    dout = xp.asarray(dout)
    if dout.shape != values.shape[:-2] + values.shape[-1:]:
        raise ValueError(f"dout of shape {dout.shape} does not match the context shape {values.shape[:-2] + values.shape[-1:]}")
    r, r_mu, r_var = cmap.expectation_grad(mu, sigma2, basis)
    weights = r @ G.T
    dvalues = weights.astype(values.dtype)[..., :, None] * dout.astype(values.dtype)[..., None, :]
    dweights = (values.astype(np.float64) @ dout.astype(np.float64)[..., :, None])[..., 0]  # (..., L)
    dr = dweights @ G  # (..., N)
    return dvalues, (dr * r_mu).sum(axis=-1), (dr * r_var).sum(axis=-1)


class ContinuousAttention(Movable):
    """Continuous attention over a sequence, with ``mu`` and ``sigma2`` computed from the data.

    For input ``x`` of shape ``(..., L, E)``: discrete scores ``s_l = x_l . q / sqrt(E)``
    give ``pi = softmax(s)`` over the positions ``t_l``; its mean and variance set
    the continuous density, ``mu = sum_l pi_l t_l`` and
    ``sigma2 = sum_l pi_l t_l^2 - mu^2 + min_variance``; the output is the
    context :func:`continuous_attention` of the values ``x W_v^T + b_v`` (shape
    ``(..., E)``).

    Parameters
    ----------
    embed_dim:
        ``E``.
    mapping:
        The continuous map: ``"softmax"`` (Gaussian), ``"sparsemax"`` (compact
        support) or ``"entmax15"``, or a generated continuous module.
    basis, ridge:
        As in :func:`continuous_attention`.
    min_variance:
        Added to the variance so that ``sigma2 > 0`` even when ``pi`` is one-hot.

    Attributes
    ----------
    params:
        ``"query"`` ``(E,)``, ``"value_weight"`` ``(E, E)``, ``"value_bias"`` ``(E,)``;
        :meth:`backward` fills ``grads`` with the same keys.
    mu, sigma2:
        The density parameters of the last :meth:`forward` call.
    """

    def __init__(self, embed_dim: int, *, mapping="softmax", basis: GaussianBasis | None = None, ridge: float = 1e-3,
                 min_variance: float = 1e-3, dtype="float64", seed=None):
        if embed_dim <= 0:
            raise ValueError(f"embed_dim must be positive, got {embed_dim}")
        if not min_variance > 0:
            raise ValueError(f"min_variance must be positive, got {min_variance}")
        self.embed_dim, self.ridge, self.min_variance = embed_dim, ridge, min_variance
        self.cmap = get_continuous_map(mapping)
        self.basis = basis if basis is not None else GaussianBasis.uniform(32)
        rng = np.random.default_rng(seed)
        bound = 1 / math.sqrt(embed_dim)
        self.params = {
            "query": rng.uniform(-bound, bound, embed_dim).astype(dtype),
            "value_weight": rng.uniform(-bound, bound, (embed_dim, embed_dim)).astype(dtype),
            "value_bias": np.zeros(embed_dim, dtype=dtype),
        }
        self.grads: dict = {}
        self._softmax = get_map("softmax")
        self._cache = None
        self.mu = self.sigma2 = None

    def forward(self, x):
        """The context ``(..., E)`` of ``x`` ``(..., L, E)``; keeps ``mu``, ``sigma2`` for inspection."""
        xp = array_module(x)
        x = xp.asarray(x)
        if x.ndim < 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"input must have shape (..., L, {self.embed_dim}), got {x.shape}")
        P = {k: xp.asarray(v) for k, v in self.params.items()}
        t = xp.asarray(positions(x.shape[-2]))
        scores = (x @ P["query"]) / math.sqrt(self.embed_dim)
        pi = self._softmax(scores.astype(np.float64))
        mu = pi @ t
        sigma2 = pi @ (t * t) - mu * mu
        sigma2 = xp.maximum(sigma2, 0.0) + self.min_variance
        values = x @ P["value_weight"].T + P["value_bias"]
        out = continuous_attention(values, mu, sigma2, mapping=self.cmap, basis=self.basis, ridge=self.ridge)
        self._cache = (x, pi, t, mu, sigma2, values)
        self.mu, self.sigma2 = mu, sigma2
        return out

    __call__ = forward

    def backward(self, dout):
        """``dx`` for the loss gradient ``dout`` ``(..., E)``; fills :attr:`grads`."""
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() first")
        x, pi, t, mu, sigma2, values = self._cache
        xp = array_module(x)
        P = {k: xp.asarray(v) for k, v in self.params.items()}
        dvalues, dmu, dvar = continuous_attention_backward(values, mu, sigma2, dout, mapping=self.cmap,
                                                           basis=self.basis, ridge=self.ridge)
        var = pi @ (t * t) - mu * mu
        dvar = xp.where(var > 0, dvar, 0.0)  # the clamp at 0 passes no gradient
        # mu = pi . t, var = pi . t^2 - mu^2: d/dpi_l = dmu t_l + dvar (t_l^2 - 2 mu t_l)
        dpi = dmu[..., None] * t + dvar[..., None] * (t * t - 2 * mu[..., None] * t)
        dscores = self._softmax.vjp(pi, dpi) / math.sqrt(self.embed_dim)
        flat_x = x.reshape(-1, self.embed_dim)
        flat_dv = dvalues.reshape(-1, self.embed_dim)
        self.grads = {
            "query": (dscores.reshape(-1) @ flat_x).astype(x.dtype, copy=False),
            "value_weight": (flat_dv.T @ flat_x).astype(x.dtype, copy=False),
            "value_bias": flat_dv.sum(axis=0).astype(x.dtype, copy=False),
        }
        dx = dvalues @ P["value_weight"] + dscores[..., None].astype(x.dtype) * P["query"]
        return dx.astype(x.dtype, copy=False)
