"""The edge rows of the bounded maps (``upper=``, ``total=``), one contract on every backend (issue 43, items 6, 7
and 14):

* ``total`` must be finite and ``> 0`` (a total of 0 leaves only ``p = 0``, at the edge of the feasible totals,
  where the derivatives in the total are one-sided: refused, as :func:`derive.box.solve_box` refuses it); bounds
  must be ``>= 0`` and not NaN.  Eager calls refuse a bad value by name; traced calls (``jax.jit``,
  ``torch.compile``) cannot read the values and cannot raise, so a row with a bad total or bound gives NaN
  (every entry), and the other rows are the map;
* a row with a ``+inf`` score gives NaN, as the unbounded map gives (and :mod:`derive.box` refuses ``+inf``);
* a fully masked row gives zeros, a NaN row NaN.

Truths: the mpmath reference :mod:`derive.box` (which refuses the same values) for the rows that are valid, and
the unbounded map for the ``+inf`` row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import numeric as nm
from derive import derive_map, gini, shannon
from derive.box import solve_box
from tests.profile import THOROUGH

INF, NAN = math.inf, math.nan
#: eager front ends (which read the values and refuse bad ones by name) and traced ones (which give NaN rows)
EAGER = ["numpy", "torch", "jax"]
TRACED = ["jax_jit", "torch_compile"]
MAPS = ["softmax", "sparsemax", "entmax15"]


def bounded(backend: str, name: str):
    """``f(x, upper, total) -> NumPy array``: the map ``name`` with bounds on ``backend``, in float64; traced
    backends take ``upper`` and ``total`` as traced arguments (arrays)."""
    if backend == "numpy":
        m = nm.get_map(name)
        return lambda x, u, c: m(np.asarray(x, dtype=np.float64), upper=u, total=c)
    if backend.startswith("torch"):
        torch = pytest.importorskip("torch")
        import numeric.torch as rt

        m = rt.get_map(name)
        f = (lambda x, u, c: m(x, upper=u, total=c))
        if backend == "torch_compile":
            # inductor in the thorough profile; dynamo and AOT autograd (the same traced checks) in the others
            f = torch.compile(f, backend="inductor" if THOROUGH else "aot_eager", fullgraph=True)

        def as_tensor(a):
            return torch.tensor(a, dtype=torch.float64) if isinstance(a, (np.ndarray, list)) else a

        return lambda x, u, c: f(as_tensor(x), as_tensor(u), as_tensor(c)).detach().numpy()
    jax = pytest.importorskip("jax")
    import numeric.jax as rj

    m = rj.get_map(name)
    f = (lambda x, u, c: m(x, upper=u, total=c))
    if backend == "jax_jit":
        f = jax.jit(f)

    def run(x, u, c):
        with jax.enable_x64(True):
            conv = (lambda a: jax.numpy.asarray(a, dtype=jax.numpy.float64) if isinstance(a, (np.ndarray, list)) else a)
            return np.asarray(f(conv(x), conv(u), conv(c)))

    return run


def _reference(name, x, upper, total):
    dv = {"softmax": derive_map(shannon()), "sparsemax": derive_map(gini())}.get(name)
    if dv is None:
        from derive import tsallis

        dv = derive_map(tsallis(__import__("sympy").Rational(3, 2)))
    return np.array([float(v) for v in solve_box(dv, x, upper=upper, total=total, digits=30).p])


# ------------------------------------------------------------------ eager: refused by name
@pytest.mark.parametrize("backend", EAGER)
@pytest.mark.parametrize("total", [0.0, -0.0, -1.0, INF, NAN, [[1.0], [0.0]], [[0.5], [-0.25]]],
                         ids=["0", "-0", "-1", "inf", "nan", "row0", "rowneg"])
def test_eager_calls_refuse_a_total_not_above_zero(backend, total):
    """``total`` must be finite and ``> 0``; a total of 0 (number or one row of an array) was taken as ``p = 0``
    on NumPy, torch and JAX while the docs and :func:`derive.box.solve_box` refused it."""
    f = bounded(backend, "sparsemax")
    x = np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])
    c = np.array(total) if isinstance(total, list) else total
    with pytest.raises(ValueError, match=r"total must be finite and > 0, got "):
        f(x, 1.0, c)


@pytest.mark.parametrize("backend", EAGER)
def test_eager_calls_refuse_a_nan_or_negative_bound(backend):
    f = bounded(backend, "sparsemax")
    x = np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])
    for u in (np.array([[NAN, 1.0, 1.0], [1.0, 1.0, 1.0]]), np.array([[1.0, 1.0, 1.0], [1.0, -0.5, 1.0]]), -1.0, NAN):
        with pytest.raises(ValueError, match=r"upper must be >= 0 everywhere"):
            f(x, u, 1.0)


def test_the_reference_refuses_the_same_values():
    """:mod:`derive.box` is the truth the numeric maps follow: it refuses a total not in ``(0, inf)``, a NaN or
    negative bound and a ``+inf`` score by name."""
    dv = derive_map(gini())
    for c in (0, -1, INF, NAN):
        with pytest.raises(ValueError, match="total must be a finite number > 0"):
            solve_box(dv, [1.0, 2.0, 3.0], upper=1.0, total=c)
    for u in ([NAN, 1, 1], [-1, 1, 1]):
        with pytest.raises(ValueError, match="upper bounds must be >= 0"):
            solve_box(dv, [1.0, 2.0, 3.0], upper=u)
    with pytest.raises(ValueError, match="score 0 is inf"):
        solve_box(dv, [INF, 0.0, 1.0], upper=0.6)


# ------------------------------------------------------------------ traced: NaN rows
#: scores, bounds and totals of rows each with one defect (its name), and a valid row last
ROWS = {
    "total 0": ([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], 0.0),
    "total -1": ([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], -1.0),
    "total inf": ([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], INF),
    "total nan": ([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], NAN),
    "nan bound": ([1.0, 2.0, 3.0], [NAN, 1.0, 1.0], 1.0),
    "negative bound": ([1.0, 2.0, 3.0], [-1.0, 1.0, 1.0], 1.0),
    "nan bound, masked": ([-INF, 2.0, 3.0], [NAN, 1.0, 1.0], 1.0),
    "total 0, masked row": ([-INF, -INF, -INF], [1.0, 1.0, 1.0], 0.0),
    "infeasible": ([1.0, 2.0, 3.0], [0.2, 0.2, 0.2], 1.0),
    "+inf score": ([INF, 0.0, 1.0], [0.6, 0.6, 0.6], 1.0),
    "nan score": ([NAN, 0.0, 1.0], [0.6, 0.6, 0.6], 1.0),
}
VALID = [([0.3, -0.4, 1.1], [0.5, 0.5, INF], 0.9), ([-INF, -INF, -INF], [0.5, 0.5, 0.5], 1.0),
         ([0.2, 0.1, -INF], [0.7, 0.7, 0.0], 1.0)]


def _batch():
    rows = list(ROWS.values()) + VALID
    x = np.array([r[0] for r in rows])
    u = np.array([r[1] for r in rows])
    c = np.array([[r[2]] for r in rows])
    return x, u, c


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", TRACED)
def test_traced_calls_give_nan_rows_for_bad_totals_and_bounds(backend, name):
    """Under ``jax.jit`` and ``torch.compile`` a NaN or negative bound, a total that is 0, negative, infinite or
    NaN, infeasible bounds, a ``+inf`` or a NaN score each make their row NaN; the valid rows are the map, a fully
    masked one zeros.  (A NaN or negative bound gave a plausible row, ``[0, 0, 1]``; a total of 0 or below zeros;
    a ``+inf`` score zeros, like a fully masked row.)"""
    if name != "sparsemax" and backend == "torch_compile" and not THOROUGH:
        pytest.skip("one compiled map in the ci profile (each compiles a while)")
    x, u, c = _batch()
    got = bounded(backend, name)(x, u, c)
    bad = len(ROWS)
    for i, what in enumerate(ROWS):
        assert np.isnan(got[i]).all(), f"{what}: {got[i]}"
    np.testing.assert_array_equal(got[bad + 1], 0)
    for i in (bad, bad + 2):
        np.testing.assert_allclose(got[i], _reference(name, *VALID[i - bad]), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ +inf scores, eager
@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("backend", EAGER)
def test_a_plus_inf_score_under_bounds_gives_nan_as_without(backend, name):
    """``softmax([inf, 0, 1], upper=0.6)`` gave ``[0, 0, 0]`` (the row was taken for a fully masked one); the
    unbounded map gives NaN for a row with a ``+inf`` score, and so does the bounded one now, on every backend; the
    other rows are untouched."""
    f = bounded(backend, name)
    x = np.array([[INF, 0.0, 1.0], [INF, INF, -INF], [0.3, -0.4, 1.1]])
    got = f(x, 0.6, 1.0)
    plain = nm.get_map(name)(x)
    assert np.isnan(plain[:2]).all()
    assert np.isnan(got[:2]).all(), got
    np.testing.assert_allclose(got[2], _reference(name, x[2].tolist(), 0.6, 1.0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", EAGER)
def test_the_derivatives_of_a_plus_inf_row_are_nan(backend):
    """The row's derivatives in the scores are NaN, as the row is (they were 0)."""
    x = np.array([[INF, 0.0, 1.0], [0.3, -0.4, 1.1]])
    dy = np.array([[0.3, -1.0, 0.5], [0.3, -1.0, 0.5]])
    if backend == "numpy":
        m = nm.get_map("entmax15")
        p = m(x, upper=0.6)
        g = m.vjp(p, dy, upper=0.6)
    elif backend == "torch":
        torch = pytest.importorskip("torch")
        import numeric.torch as rt

        xt = torch.tensor(x, requires_grad=True)
        (g,) = torch.autograd.grad(rt.entmax15(xt, upper=0.6), xt, torch.tensor(dy))
        g = g.numpy()
    else:
        jax = pytest.importorskip("jax")
        import numeric.jax as rj

        with jax.enable_x64(True):
            g = np.asarray(jax.grad(lambda a: (rj.entmax15(a, upper=0.6) * dy).sum())(jax.numpy.asarray(x)))
    assert np.isnan(g[0]).all() and np.isfinite(g[1]).all()
