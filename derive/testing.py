"""Property checks of a generated map against its symbolic truth, for a user's own tests and CI.

:func:`check_map` runs hypothesis on a map written by ``regattn generate`` (a
built-in name such as ``"entmax15"``, a module from ``numeric._generated`` or one
generated with ``--expr``, or a map from :func:`numeric.get_map`) and compares what
each backend computes, NumPy and, where installed, PyTorch and JAX, in float64
and float32, with the mpmath reference of the map's derivation
(:mod:`derive.reference`, the regularizer read from the module's ``REGULARIZER``
and the domains of its ``PARAMETERS``).  For each drawn score row ``s``,
parameter values, tangent ``v`` and target ``y`` it checks

* ``values``: ``|p_i - p*_i| <= bound_i`` for every entry;
* ``simplex``: ``p >= 0``, ``|sum p - 1| <= total``, and ``p_i = 0`` exactly where
  ``s_i = -inf``;
* ``KKT``: with ``tau`` read off the largest output, ``tau = s_k - omega'(p_k)``,
  every ``p_i = g_+(s_i - tau)`` within ``bound_i`` (stationarity and
  complementary slackness of the output alone), and for a sparse map ``p_i = 0``
  exactly where ``s_i - tau* <= omega'(0+)`` by more than the rounding of
  ``s_i - tau*``;
* ``JVP``: the map's JVP (NumPy's ``jvp``, torch's backward, ``jax.jvp``) at its
  own output ``p`` against ``J v = w*v - w (w.v)/sum(w)`` with the derived weight
  ``w = 1/omega''(p)`` at 50 digits;
* ``loss``: the Fenchel-Young loss ``Omega*(s) + Omega(y) - <s, y>`` against the
  reference's, within ``loss`` times its scale (plus, for each ``p*_i`` below
  the dtype's smallest normal number, what the loss moves by if it comes out 0:
  XLA flushes subnormal numbers to zero on CPU);
* ``gradient``: the loss's gradient in the scores (NumPy's ``loss_and_grad``,
  autograd) against ``p* - y``.

The bounds follow the dtype (:data:`TOLERANCES`, those of the project's own
tests: 1e-12 in float64 and 2e-6 in float32 on a value, 1e-12 and 1e-5 on the
sum, 1e-10 and 1e-5 on the loss relative to its scale), a value's widened
where the map is ill-conditioned: ``bound_i = value +
g_+(z_i + d_i) - g_+(z_i - d_i)``, the spread of the clipped link ``g_+`` over
``z_i = s_i - tau* +- d_i`` with ``d_i = value (1 + |s_i - max s| + |tau* - max
s|) / 2``.  Where the link is flat that is about ``value (1 + w_i)``, the rule
``1e-12 max(1, w)`` of ``tests/numeric``; near the clip of a steep link (alpha-entmax
for alpha > 2, ``p**3``) it is what the rounding of ``z`` alone allows there.

hypothesis is an optional dependency (the extra ``[test]``); ``import derive`` does
not import it, this module does.  A map that passes returns a
:class:`CheckResult`; a map that fails raises :class:`MapCheckError` (an
:class:`AssertionError`) naming the check, the backend, the dtype and the
falsifying example as hypothesis shrank it::

    >>> from derive.testing import check_map
    >>> result = check_map("sparsemax", backends=("numpy",), max_examples=5)
    >>> result.ran, result.examples
    (('numpy',), 5)
    >>> print(result.lines[0].line())  # doctest: +ELLIPSIS
    numpy  values    5 examples (...): max error / bound = ...
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType

import mpmath
import numpy as np

try:
    import hypothesis
    from hypothesis import HealthCheck, Phase
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("derive.testing needs hypothesis, an optional dependency: pip install hypothesis "
                      "(or pip install 'regattn[test]')") from None

import numeric as nm
from numeric import family

from . import reference as R
from .argmax import derive_map
from .derivation import Derivation
from .errors import DerivationError
from .reference import compiled
from .regularizers import Parameter, Regularizer

__all__ = ["BACKENDS", "CHECKS", "DTYPES", "TOLERANCES", "Tolerance", "Example", "CheckLine", "CheckResult",
           "MapCheckError", "rows", "parameters", "tangents", "distributions", "examples", "derivation_for",
           "generated_map", "check_map"]

#: The backends :func:`check_map` knows, in the order it runs them.
BACKENDS = ("numpy", "torch", "jax")
#: The checks, in the order each example runs them (the module docstring says what each compares).
CHECKS = ("values", "simplex", "KKT", "JVP", "loss", "gradient")
#: The dtypes rows are drawn in.
DTYPES = ("float64", "float32")
#: Significant digits of the reference values.
DIGITS = 30
_WORK = DIGITS + 20


@dataclass(frozen=True)
class Tolerance:
    """The bounds of one dtype: ``value`` on an entry of ``p`` (and of the gradient, ``p - y``), before the
    widening by the link's spread (module docstring), ``total`` on ``|sum p - 1|``, ``loss`` on the Fenchel-Young
    loss relative to its scale ``1 + sum_i (y_i + p_i) |s_i - max s| + |omega(y_i)| + |omega(p_i)|``."""

    value: float
    total: float
    loss: float


#: The bounds of each dtype: those of ``tests/numeric`` and ``tests/torch`` (values 1e-12 in float64 against the
#: reference, 2e-6 in float32 on rows exact in float32; sums 1e-12 and 1e-5; the loss 1e-10 in float64); the
#: float32 loss, which those tests do not compare with the reference, takes their float32 bound on a sum.
TOLERANCES = {
    "float64": Tolerance(value=1e-12, total=1e-12, loss=1e-10),
    "float32": Tolerance(value=2e-6, total=1e-5, loss=1e-5),
}


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in TOLERANCES:
        raise ValueError(f"rows are drawn in {' or '.join(TOLERANCES)}, got dtype {name}")
    return name


# ------------------------------------------------------------------ strategies
def _big(dtype: str) -> float:
    """The magnitude of the extreme scores: 1e30 in float64, a quarter of float32's largest (differences of two
    such scores stay finite), as in ``tests/numeric``."""
    return 1e30 if dtype == "float64" else float(np.finfo(np.float32).max) / 4


def _elements(dtype: str):
    width = 64 if dtype == "float64" else 32
    big = _big(dtype)

    def floats(bound):  # (a bound the dtype holds)
        bound = float(np.dtype(dtype).type(bound))
        return st.floats(-bound, bound, width=width)

    return st.one_of(
        floats(50),
        floats(1e12),  # wide spreads
        floats(1e-9),  # tiny ones
        st.integers(-3, 3).map(float),  # ties
        st.sampled_from([big, -big]),  # extreme magnitudes
    )


@st.composite
def rows(draw, dtype="float64", *, min_size: int = 1, max_size: int = 16, masked: bool = True) -> np.ndarray:
    """Score rows: 1-D arrays of ``dtype`` (float64 or float32) with ``min_size`` to ``max_size`` entries.

    Entries mix moderate scores, spreads up to 1e12, spreads of 1e-9, small integers (ties), and
    ``+-1e30`` (float32: ``+-max/4``); a row may be moved to ``+-1e6`` with its spread shrunk a thousandfold (a
    large offset, rounded to the dtype), and with ``masked`` some entries are ``-inf``, never all of them.
    Values are exact in ``dtype``: the reference sees the very numbers the map does.

    >>> import numpy as np
    >>> from hypothesis import Phase, find, settings
    >>> first = settings(phases=[Phase.generate], database=None)  # the first row found, not shrunk (slow)
    >>> x = find(rows("float32"), lambda x: np.isneginf(x).any() and len(set(x[np.isfinite(x)])) < np.isfinite(x).sum(),
    ...          settings=first)
    >>> x.dtype, bool(np.isfinite(x).any())
    (dtype('float32'), True)
    """
    dtype = _dtype_name(dtype)
    n = draw(st.integers(min_size, max_size))
    values = np.array(draw(st.lists(_elements(dtype), min_size=n, max_size=n)), dtype=np.float64)
    offset = draw(st.sampled_from([0.0, 0.0, 1e6, -1e6]))
    if offset:
        values = values * 1e-3 + offset
    if masked:
        keep = draw(st.integers(0, n - 1))
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        values[[j for j, m in enumerate(mask) if m and j != keep]] = -math.inf
    return values.astype(dtype)


def _module(mapping) -> ModuleType:
    """The generated module of a map given as a name, a module or a map object (numeric, torch or JAX)."""
    from numeric.families import FAMILIES, Family
    from numeric.maps import import_map_module

    if (isinstance(mapping, str) and mapping in FAMILIES) or isinstance(getattr(mapping, "family", None), Family):
        name = mapping if isinstance(mapping, str) else mapping.name
        raise TypeError(f"{name!r} is a map family (numeric.families), not one generated from a separable regularizer")
    module = getattr(mapping, "module", None)
    if isinstance(module, ModuleType):
        mapping = module
    if isinstance(mapping, str):
        mapping = import_map_module(mapping)
    if not isinstance(mapping, ModuleType):
        raise TypeError(f"a map is a name, a generated module or a map of numeric.get_map, got {type(mapping).__name__}")
    if not isinstance(getattr(mapping, "REGULARIZER", None), str) or not hasattr(mapping, "PARAMETER_DOMAINS"):
        raise TypeError(f"{getattr(mapping, 'NAME', mapping.__name__)!r} is not a map generated from a separable "
                        "regularizer (regattn generate): it has no REGULARIZER and PARAMETER_DOMAINS to check against")
    return mapping


def parameters(mapping, *, margin: float = 0.01, span: float = 4.0):
    """Values of a map's parameters inside their declared domains, as dicts ``{name: float}``.

    A parameter on ``(lo, hi)`` (``PARAMETER_DOMAINS`` of the generated module) is drawn from ``[a + m, b - m]``
    where ``[a, b]`` is the domain with an infinite end put ``span`` from the other (``(-span/2, span/2)`` for the
    whole line) and ``m = margin (b - a)``: values near an end of the domain (alpha-entmax at ``alpha -> 1+``)
    are left out, those of a family's point cases (alpha-entmax's softmax at ``alpha = 1``) are drawn too.
    ``mapping`` is a name, a generated module or a map; a map with no parameters gives ``{}``.

    >>> from hypothesis import Phase, find, settings
    >>> first = settings(phases=[Phase.generate], database=None)  # the first value found, not shrunk (slow)
    >>> find(parameters("entmax"), lambda v: v["alpha"] > 1, settings=first)["alpha"] > 1
    True
    >>> find(parameters("softmax"), lambda v: True, settings=first)
    {}
    """
    module = _module(mapping)
    if not 0 <= margin < 0.5:
        raise ValueError(f"margin must lie in [0, 0.5), got {margin!r}")
    if not span > 0:
        raise ValueError(f"span must be positive, got {span!r}")
    points = [lo for lo, hi, _ in getattr(module, "CASES", None) or () if lo == hi]
    drawn = {}
    for name in module.PARAMETERS:
        lo, hi = (float(v) for v in module.PARAMETER_DOMAINS[name])
        a = lo if math.isfinite(lo) else (hi - span if math.isfinite(hi) else -span / 2)
        b = hi if math.isfinite(hi) else a + span
        m = margin * (b - a)
        values = st.floats(a + m, b - m, exclude_min=m == 0, exclude_max=m == 0)
        if points and name == getattr(module, "FAMILY_PARAMETER", None):
            values = st.one_of(values, st.sampled_from(points))
        drawn[name] = values
    return st.fixed_dictionaries(drawn)


def tangents(row: np.ndarray):
    """Tangents (and cotangents) for ``row``: arrays of its shape and dtype with entries in ``[-1, 1]``."""
    width = 64 if row.dtype == np.float64 else 32
    return st.lists(st.floats(-1, 1, width=width), min_size=row.size, max_size=row.size).map(
        lambda v: np.array(v, dtype=row.dtype))


def distributions(row: np.ndarray):
    """Targets for the loss of ``row``: distributions on its finite entries, of its dtype, each entry a multiple of
    ``2**-k`` (``k <= 3``) so that the entries sum to 1 exactly (one-hot for ``k = 0``)."""
    finite = np.flatnonzero(np.isfinite(row)).tolist()

    @st.composite
    def draw_target(draw):
        m = 2 ** draw(st.integers(0, 3))
        picks = draw(st.lists(st.sampled_from(finite), min_size=m, max_size=m))
        return (np.bincount(picks, minlength=row.size) / m).astype(row.dtype)

    return draw_target()


@dataclass(frozen=True, eq=False)
class Example:
    """One drawn case: the scores ``row`` (its dtype is the example's), the parameter values, a tangent for the
    JVP and a target for the loss."""

    row: np.ndarray
    params: Mapping[str, float]
    tangent: np.ndarray
    target: np.ndarray

    @property
    def dtype(self) -> str:
        return self.row.dtype.name

    def __repr__(self) -> str:
        return (f"Example(row={_text(self.row)}, params={dict(self.params)!r}, tangent={_text(self.tangent)}, "
                f"target={_text(self.target)})")


def _text(a: np.ndarray) -> str:
    """An array as NumPy code that rebuilds it exactly."""
    items = ", ".join("-np.inf" if v == -math.inf else "np.inf" if v == math.inf else repr(float(v)) for v in a.tolist())
    return f"np.array([{items}], dtype=np.{a.dtype.name})"


def examples(mapping, *, dtypes: Sequence[str] = DTYPES, params: Mapping[str, float] | None = None,
             max_size: int = 16):
    """:class:`Example`\\ s for ``mapping``: a row of one of ``dtypes`` (:func:`rows`), parameter values
    (``params``, or drawn by :func:`parameters`), a tangent and a target (:func:`tangents`, :func:`distributions`)."""
    dtypes = tuple(_dtype_name(d) for d in dtypes)
    values = st.just(dict(params)) if params is not None else parameters(mapping)

    @st.composite
    def draw_example(draw):
        row = draw(rows(draw(st.sampled_from(dtypes)), max_size=max_size))
        return Example(row, draw(values), draw(tangents(row)), draw(distributions(row)))

    return draw_example()


# ------------------------------------------------------------------ the reference
def _bound(value: float) -> str:
    return "oo" if value == math.inf else "-oo" if value == -math.inf else repr(float(value))


@lru_cache(maxsize=64)
def _derive(text: str, name: str, domains: tuple) -> Derivation:
    parameters = tuple(Parameter.from_spec((q, _bound(lo), _bound(hi))) for q, lo, hi in domains)
    return derive_map(Regularizer.from_string(text, name=name, parameters=parameters))


def derivation_for(mapping, **params: float) -> tuple[Derivation, dict]:
    """``(derivation, params)``: the derivation of a generated map (a name, a module or a map) from its
    ``REGULARIZER`` and the domains of its ``PARAMETERS``, and the parameter values it takes; for a family
    (``CASES``, e.g. ``entmax``) the derivation of the case that holds the values (a point case's without the
    family's parameter).  Derivations are cached.

    >>> dv, values = derivation_for("entmax", alpha=1.0)
    >>> dv.name, values
    ('softmax', {})
    >>> derivation_for("entmax", alpha=1.5)[0].sparse
    True
    """
    module = _module(mapping)
    cases = getattr(module, "CASES", None)
    if cases:
        q = module.FAMILY_PARAMETER
        i = family.case_index(cases, float(params[q]))
        if i is None:
            raise ValueError(f"parameter {q} = {params[q]} lies in no case of {module.NAME!r}")
        case = family.case_modules(module)[i]
        return derivation_for(case, **{k: v for k, v in params.items() if k in case.PARAMETERS})
    missing = set(module.PARAMETERS) - set(params)
    if missing:
        raise ValueError(f"map {module.NAME!r} needs values for parameter(s) {sorted(missing)}")
    domains = tuple((q, *module.PARAMETER_DOMAINS[q]) for q in module.PARAMETERS)
    dv = _derive(module.REGULARIZER, module.NAME, domains)
    return dv, {q: float(params[q]) for q in module.PARAMETERS}


def _central(comp, probs) -> int:
    """The entry ``k`` whose ``tau = s_k - omega'(p_k)`` is read: the largest ``p_k``; where omega's domain ends at 1
    (``omega'`` steep near it) the largest weight ``w(p_k) = 1/omega''(p_k)``, 0 at 1, ties to the larger ``p_k``."""
    if comp.dv.omega_one is None:
        return max(range(len(probs)), key=lambda i: probs[i])
    return max((i for i, q in enumerate(probs) if q > 0), key=lambda i: (comp.weight(min(probs[i], 1)), probs[i]))


class _Truth:
    """The reference of one example at ``DIGITS`` digits, and the bounds of its dtype (module docstring)."""

    def __init__(self, dv: Derivation, params: dict, example: Example):
        tol = TOLERANCES[example.dtype]
        row = example.row.astype(np.float64)
        self.finite = np.isfinite(row)
        self.sparse = dv.sparse
        with mpmath.workdps(_WORK):
            self.comp = comp = compiled(dv, params)
            probs = R.evaluate(dv, row.tolist(), digits=DIGITS, **params)
            top = mpmath.mpf(float(row[self.finite].max()))
            # the scores shifted by their maximum, exactly (p and the loss do not change)
            self.d = [mpmath.fsub(mpmath.mpf(v), top, exact=True) if f else -mpmath.inf
                      for v, f in zip(row.tolist(), self.finite)]
            k = _central(comp, probs)
            self.t = self.d[k] - comp.d1(probs[k])  # tau* - max s
            self.p = np.array([float(q) for q in probs])
            bound, zero = np.zeros(row.size), ~self.finite
            for i in np.flatnonzero(self.finite):
                if self.t == -mpmath.inf:  # (one live score where omega's domain ends at 1: p = 1 at tau = -oo)
                    bound[i] = tol.value
                    continue
                z, delta = self.d[i] - self.t, tol.value * (1 + abs(self.d[i]) + abs(self.t)) / 2
                high = self.g(z + delta)
                bound[i] = tol.value + float(high - self.g(z - delta))
                zero[i] = self.sparse and high == 0
            self.bound, self.zero = bound, zero
            ys = [mpmath.mpf(float(v)) for v in example.target.tolist()]
            self.loss = float(R.fenchel_young(comp, self.d, probs, ys))
            terms = [(y + q) * abs(d) + abs(self.omega(y)) + abs(self.omega(q))
                     for d, y, q in zip(self.d, ys, probs) if d != -mpmath.inf]
            # a p*_i below the dtype's smallest normal number may come out 0 (XLA flushes subnormals to zero),
            # which moves the loss by omega(p*_i) - omega(0+) - p*_i s_i: large where omega'(0+) = -oo
            tiny = mpmath.mpf(float(np.finfo(example.dtype).tiny))
            flushed = [abs(self.omega(q) - self.omega(0) - q * d) for d, q in zip(self.d, probs) if 0 < q < tiny]
            self.loss_bound = tol.loss * float(1 + mpmath.fsum(terms)) + float(mpmath.fsum(flushed))

    def g(self, z) -> mpmath.mpf:
        """The clipped link ``g_+(z)`` for ``z`` relative to the maximum score (``z = s - tau``)."""
        return self.comp.g(z)

    def omega(self, q) -> mpmath.mpf:
        return self.comp.omega(q) if q > 0 else self.comp.omega_zero()

    def kkt(self, p: np.ndarray) -> np.ndarray:
        """``|p_i - g_+(s_i - tau)|`` with ``tau = s_k - omega'(p_k)`` read off the entry ``_central`` picks."""
        with mpmath.workdps(_WORK):
            if not np.where(self.finite, p, -1.0).max() > 0:
                return np.full(p.size, math.inf)
            k = _central(self.comp, [mpmath.mpf(float(q)) if f else mpmath.mpf(-1) for q, f in zip(p, self.finite)])
            t = self.d[k] - self.comp.d1(mpmath.mpf(float(p[k])))
            t = self.t if t == -mpmath.inf else t  # (p_k rounded to 1 where omega'(1) = +oo shows no tau: the reference's)
            return np.array([abs(float(p[i]) - float(self.g(self.d[i] - t))) if f else abs(float(p[i]))
                             for i, f in enumerate(self.finite)])

    def jvp(self, p: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(J v, bound)`` at the output ``p``: ``J v = w*v - w (w.v)/sum(w)``, ``w = 1/omega''(p)`` on the
        support; the bound is ``value (1 + w_i |v_i| + w_i sum_j w_j |v_j| / sum_j w_j)``."""
        with mpmath.workdps(_WORK):
            w = [self.comp.weight(mpmath.mpf(float(q))) if q > 0 else mpmath.mpf(0) for q in p.tolist()]
            vs = [mpmath.mpf(float(x)) for x in v.tolist()]
            total = mpmath.fsum(w)
            if total == 0:
                return np.zeros(p.size), np.zeros(p.size)
            wv = mpmath.fsum(a * b for a, b in zip(w, vs)) / total
            wav = mpmath.fsum(a * abs(b) for a, b in zip(w, vs)) / total
            exact = np.array([float(a * b - a * wv) for a, b in zip(w, vs)])
            scale = np.array([float(a * abs(b) + a * wav) for a, b in zip(w, vs)])
        return exact, scale


# ------------------------------------------------------------------ the backends
@dataclass(frozen=True)
class _Outputs:
    p: np.ndarray
    jvp_p: np.ndarray
    jvp: np.ndarray
    loss: float
    grad: np.ndarray


class _Failure(Exception):
    """A backend that raised at one stage (``check``) of an example."""

    def __init__(self, check: str, exc: BaseException):
        super().__init__(f"raised {type(exc).__name__}: {' '.join(str(exc).split())}")
        self.check = check


def _stage(check: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        raise _Failure(check, exc) from exc


def _numpy_backend(m):
    def run(x, v, y):
        p = _stage("values", m, x)
        jvp = _stage("JVP", m.jvp, p, v)
        value, grad = _stage("loss", lambda: m.loss_and_grad(x, y, reduction="sum"))
        return _Outputs(*(np.asarray(a, dtype=np.float64) for a in (p, p, jvp)), float(value),
                        np.asarray(grad, dtype=np.float64))

    return run


def _torch_backend(module, threshold, params):
    import torch

    from numeric import torch as rt

    tm = rt.get_map(module, threshold=threshold, **params)

    def forward(x):
        with torch.no_grad():
            return tm(torch.from_numpy(x))

    def jvp(x, v):
        xt = torch.from_numpy(x).requires_grad_()
        p = tm(xt)
        (g,) = torch.autograd.grad(p, xt, torch.from_numpy(v))  # J^T v = J v: J is symmetric
        return p.detach(), g

    def loss(x, y):
        xt = torch.from_numpy(x).requires_grad_()
        value = rt.fenchel_young_loss(xt, torch.from_numpy(y), mapping=tm, reduction="sum")
        (g,) = torch.autograd.grad(value, xt)
        return value.detach(), g

    def run(x, v, y):
        p = _stage("values", forward, x)
        jp, jv = _stage("JVP", jvp, x, v)
        value, grad = _stage("loss", loss, x, y)
        return _Outputs(*(a.double().numpy() for a in (p, jp, jv)), float(value), grad.double().numpy())

    return run


def _jax_backend(module, threshold, params, width: int):
    """The JAX map on rows padded with ``-inf`` (masked: as if absent) to ``width`` entries, so that one compiled
    program per dtype serves every row length."""
    import jax
    import jax.numpy as jnp

    from numeric import jax as rj

    jm = rj.get_map(module, threshold=threshold, **params)

    def pad(a, fill):
        return np.concatenate([a, np.full(width - a.size, fill, dtype=a.dtype)])

    def loss_of(y):
        return lambda s: rj.fenchel_young_loss(s, y, mapping=jm, reduction="sum")

    def run(x, v, y):
        n = x.size
        with jax.enable_x64(True):
            xs, vs, ys = jnp.asarray(pad(x, -np.inf)), jnp.asarray(pad(v, 0)), jnp.asarray(pad(y, 0))
            p = _stage("values", jm, xs)
            jp, jv = _stage("JVP", jax.jvp, jm, (xs,), (vs,))
            value, grad = _stage("loss", jax.value_and_grad(loss_of(ys)), xs)
            out = [np.asarray(a, dtype=np.float64) for a in (p, jp, jv, grad)]
        if width > n and (out[0][n:] != 0).any():
            raise _Failure("simplex", AssertionError("the -inf padding of the row got probability"))
        return _Outputs(out[0][:n], out[1][:n], out[2][:n], float(value), out[3][:n])

    return run


# ------------------------------------------------------------------ results
@dataclass(frozen=True)
class CheckLine:
    """One check on one backend: the examples it ran (in ``dtypes``) and its worst error as a fraction of its
    bound (at most 1: it passed)."""

    backend: str
    check: str
    examples: int
    dtypes: tuple[str, ...]
    worst: float

    def line(self) -> str:
        return (f"{self.backend:<6} {self.check:<9} {self.examples} examples ({', '.join(self.dtypes)}): "
                f"max error / bound = {self.worst:.2g}")


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check_map` ran: the map's name, its parameter values (``None``: drawn), the examples, one
    :class:`CheckLine` per backend and check, and ``(backend, why)`` for each backend that did not run."""

    name: str
    params: Mapping[str, float] | None
    examples: int
    lines: tuple[CheckLine, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def ran(self) -> tuple[str, ...]:
        """The backends that ran."""
        return tuple(dict.fromkeys(line.backend for line in self.lines))

    @property
    def ok(self) -> bool:
        """Always true: a check that fails raises :class:`MapCheckError`."""
        return True

    def report(self) -> str:
        """One line per backend and check, one per backend that did not run."""
        skipped = [f"{backend:<6} not checked: {why}" + (f" (pip install 'regattn[{backend}]')" if why == "not installed" else "")
                   for backend, why in self.skipped]
        return "\n".join([line.line() for line in self.lines] + skipped) + "\n"


class MapCheckError(AssertionError):
    """A property :func:`check_map` checks does not hold: ``check`` on ``backend`` in ``dtype``, at ``example``
    (shrunk by hypothesis), ``detail`` what was wrong.  The message holds all of them and the outputs."""

    def __init__(self, name: str, backend: str, check: str, example: Example, detail: str, outputs: str = ""):
        self.name, self.backend, self.check, self.example, self.detail = name, backend, check, example, detail
        params = f"\n  params  = {dict(example.params)!r}" if example.params else ""
        super().__init__(
            f"check_map({name!r}): {check} FAILED on {backend}, {example.dtype}: {detail}\n"
            f"  row     = {_text(example.row)}{params}\n"
            f"  tangent = {_text(example.tangent)}\n"
            f"  target  = {_text(example.target)}{outputs}")

    @property
    def dtype(self) -> str:
        return self.example.dtype


@dataclass
class _Tally:
    """Examples run and worst error / bound, per (backend, check), and the dtypes seen."""

    counts: dict = field(default_factory=dict)
    worst: dict = field(default_factory=dict)
    dtypes: dict = field(default_factory=dict)

    def add(self, backend: str, check: str, ratio: float, dtype: str) -> None:
        key = (backend, check)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.worst[key] = max(self.worst.get(key, 0.0), ratio)
        self.dtypes.setdefault(key, {})[dtype] = True


def _ratio(error: np.ndarray, bound: np.ndarray) -> tuple[float, int]:
    """The largest ``error / bound`` (NaN counts as infinite; a zero bound asks for a zero error) and where."""
    error = np.where(np.isnan(error), np.inf, np.abs(error))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / bound)
    if ratio.size == 0:
        return 0.0, -1
    i = int(np.argmax(ratio))
    return float(ratio[i]), i


def _judge(truth: _Truth, out: _Outputs, example: Example) -> list[tuple[str, float, str]]:
    """``(check, worst error / bound, what was wrong)`` for each check of one backend's outputs."""
    tol = TOLERANCES[example.dtype]
    y = example.target.astype(np.float64)
    results = []
    ratio, i = _ratio(out.p - truth.p, truth.bound)
    results.append(("values", ratio, f"|p - p*| = {abs(out.p[i] - truth.p[i]):.3g} > {truth.bound[i]:.3g} at entry {i}"))
    off = abs(math.fsum(out.p.tolist()) - 1) if np.isfinite(out.p).all() else math.inf
    negative = bool((out.p < 0).any() or (out.p[~truth.finite] != 0).any())
    results.append(("simplex", math.inf if negative else off / tol.total,
                    "a negative p or a masked score with p != 0" if negative else f"|sum p - 1| = {off:.3g} > {tol.total:g}"))
    zeros = np.flatnonzero(truth.zero & (out.p != 0))
    residual = truth.kkt(out.p)
    ratio, i = _ratio(residual, truth.bound)
    results.append(("KKT", math.inf if zeros.size else ratio,
                    f"p = {out.p[zeros[0]]!r} != 0 at entry {zeros[0]}, below the clip" if zeros.size else
                    f"|p_i - g_+(s_i - tau)| = {residual[i]:.3g} > {truth.bound[i]:.3g} at entry {i}, "
                    "tau = s_k - omega'(p_k) at the largest p_k"))
    exact, scale = truth.jvp(out.jvp_p, example.tangent.astype(np.float64))
    bound = tol.value * (1 + scale)
    ratio, i = _ratio(out.jvp - exact, bound)
    results.append(("JVP", ratio, f"|Jv - (Jv)*| = {abs(out.jvp[i] - exact[i]):.3g} > {bound[i]:.3g} at entry {i}"))
    if math.isinf(truth.loss):
        ratio = 0.0 if out.loss == truth.loss else math.inf
    else:
        ratio = _ratio(np.array([out.loss - truth.loss]), np.array([truth.loss_bound]))[0]
    results.append(("loss", ratio, f"loss = {out.loss!r}, reference {truth.loss!r}, bound {truth.loss_bound:.3g}"))
    ratio, i = _ratio(out.grad - (truth.p - y), truth.bound)
    results.append(("gradient", ratio, f"|grad - (p* - y)| = {abs(out.grad[i] - truth.p[i] + y[i]):.3g} > "
                                       f"{truth.bound[i]:.3g} at entry {i}"))
    return results


def _outputs_text(truth: _Truth, out: _Outputs | None) -> str:
    if out is None:
        return f"\n  p*      = {truth.p.tolist()!r}"
    return f"\n  p       = {out.p.tolist()!r}\n  p*      = {truth.p.tolist()!r}"


# ------------------------------------------------------------------ check_map
def _target(mapping, params):
    """``(module, numpy map or None, fixed parameter values or None, threshold)`` of what check_map was given."""
    module = _module(mapping)
    bound = dict(getattr(mapping, "params", None) or {})
    if bound and params is not None:
        raise ValueError("give the parameter values to the map or to check_map's params, not to both")
    if isinstance(mapping, nm.Map) and mapping.per_row:
        raise ValueError("check_map takes a map with one value per parameter, not one per row")
    values = bound or params
    fixed = None if values is None and module.PARAMETERS else {q: float(v) for q, v in (values or {}).items()}
    threshold = getattr(mapping, "threshold", "auto")
    threshold = threshold if threshold in ("sort", "root") and threshold != module.THRESHOLD else "auto"
    return module, mapping if isinstance(mapping, nm.Map) else None, fixed, threshold


def check_map(mapping, backends: Sequence[str] = BACKENDS, *, max_examples: int = 100,
              params: Mapping[str, float] | None = None, dtypes: Sequence[str] = DTYPES, max_size: int = 16,
              seed: int | None = 0) -> CheckResult:
    """Property-test a generated map against its mpmath reference with hypothesis (see the module docstring).

    Parameters
    ----------
    mapping:
        A built-in name (``"entmax15"``), the name of an importable module ``regattn generate`` wrote, such a
        module, or a map of :func:`numeric.get_map` (the NumPy checks run that very object, a subclass too; torch
        and JAX run its module with its parameters), or of ``numeric.torch``/``numeric.jax``.
    backends:
        Any of ``"numpy"``, ``"torch"``, ``"jax"``; one not installed is skipped and named (in the
        result's :attr:`CheckResult.skipped`).
    max_examples:
        Examples hypothesis draws (each runs every backend).
    params:
        Parameter values to check at; by default a map's bound values, else drawn inside their domains
        (:func:`parameters`).
    dtypes:
        The dtypes rows are drawn in.
    max_size:
        The longest row (the JAX map runs every row padded to it with ``-inf``: one compiled program).
    seed:
        hypothesis's seed (``None``: a random one): a run is repeatable.

    Returns
    -------
    CheckResult
        What ran.  Raises :class:`MapCheckError` at the first property that does not hold, with the example
        hypothesis shrank it to, and :class:`ValueError` for arguments it cannot take.

    Examples
    --------
    >>> result = check_map("entmax", backends=("numpy",), params={"alpha": 1.5}, max_examples=3)
    >>> result.name, result.params, [line.check for line in result.lines]
    ('entmax', {'alpha': 1.5}, ['values', 'simplex', 'KKT', 'JVP', 'loss', 'gradient'])
    """
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ValueError(f"backends must be some of {', '.join(BACKENDS)}, got {list(backends)!r}")
    if not (isinstance(max_examples, int) and max_examples >= 1):
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    if not (isinstance(max_size, int) and max_size >= 1):
        raise ValueError(f"max_size must be a positive int, got {max_size!r}")
    dtypes = tuple(_dtype_name(d) for d in dtypes)
    module, numpy_map, fixed, threshold = _target(mapping, params)
    name = module.NAME
    if fixed is not None:
        derivation_for(module, **fixed)  # the values are checked before anything runs
        nm.get_map(module, **fixed)
    installed = [b for b in BACKENDS if b in backends and (b == "numpy" or importlib.util.find_spec(b) is not None)]
    skipped = tuple((b, "not installed") for b in BACKENDS if b in backends and b not in installed)
    tally = _Tally()
    examples_run = [0]

    def runner(backend: str, values: dict):
        if backend == "numpy":
            return _numpy_backend(numpy_map if numpy_map is not None else nm.get_map(module, **values))
        if backend == "torch":
            return _torch_backend(module, threshold, values)
        return _jax_backend(module, threshold, values, max_size)

    cache: dict = {}

    def backend_run(backend: str, values: dict):
        key = (backend, tuple(sorted(values.items())))
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = runner(backend, values)
        return cache[key]

    def run_example(example: Example) -> None:
        examples_run[0] += 1
        dv, values = derivation_for(module, **example.params)
        try:
            truth = _Truth(dv, values, example)
        except DerivationError as exc:
            raise DerivationError(f"the reference of {name!r} failed at {example!r}: {exc}") from exc
        x, v, y = (np.array(a) for a in (example.row, example.tangent, example.target))
        for backend in installed:
            try:
                out = backend_run(backend, dict(example.params))(x, v, y)
            except _Failure as exc:
                raise MapCheckError(name, backend, exc.check, example, str(exc), _outputs_text(truth, None)) from exc
            for check, ratio, detail in _judge(truth, out, example):
                tally.add(backend, check, ratio, example.dtype)
                if not ratio <= 1:
                    raise MapCheckError(name, backend, check, example, detail, _outputs_text(truth, out))

    settings = hypothesis.settings(
        max_examples=max_examples, deadline=None, database=None, derandomize=False, print_blob=False,
        report_multiple_bugs=False, phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    test = settings(hypothesis.given(examples(module, dtypes=dtypes, params=fixed, max_size=max_size))(run_example))
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    test()
    lines = tuple(CheckLine(backend, check, tally.counts.get((backend, check), 0),
                            tuple(d for d in dtypes if d in tally.dtypes.get((backend, check), {})),
                            tally.worst.get((backend, check), 0.0))
                  for backend in installed for check in CHECKS)
    return CheckResult(name, fixed, examples_run[0], lines, skipped)


# ------------------------------------------------------------------ a map from text
@contextlib.contextmanager
def generated_map(regularizer: str | Regularizer, name: str = "custom",
                  folder: str | None = None) -> Iterator[ModuleType]:
    """The module ``regattn generate --expr ... --name name --out folder`` writes (a family's case modules too),
    imported while the context lasts and removed from ``sys.modules`` after; ``folder`` defaults to a temporary
    one, deleted after.  ``regularizer`` is text (parsed as ``--expr`` is) or a :class:`Regularizer` (with its
    parameters).  ``name`` must shadow no other module (:func:`derive.codegen.files.check_module_name`) and
    must not be imported already.

    >>> with generated_map("p**3", "cube_doc") as module:
    ...     module.NAME, module.SPARSE, check_map(module, backends=("numpy",), max_examples=3).examples
    ('cube_doc', True, 3)
    """
    from .codegen.files import write_user_module

    if name in sys.modules:
        raise ValueError(f"a module named {name!r} is imported already; choose another name")
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="regattn-check-"))
        write_user_module(regularizer, name, folder)
        sys.path.insert(0, str(folder))
        importlib.invalidate_caches()
        try:
            yield importlib.import_module(name)
        finally:
            sys.path.remove(str(folder))
            for module in [m for m in sys.modules if m == name or m.startswith(f"{name}_case")]:
                sys.modules.pop(module, None)

