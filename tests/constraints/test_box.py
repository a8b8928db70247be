"""The box constraint (``0 <= p <= upper``, ``sum p = total``) on the maps and the Fenchel-Young loss of every
backend (NumPy, torch, JAX): values along an axis, derivatives in the scores, the bounds, the total and alpha, the
loss and its gradients, and the errors, each property written once.

Truths: the bounded mpmath reference :mod:`derive.box` for values and the loss's gradients; central differences of
the NumPy map and loss for derivatives (NumPy's ``vjp``, ``vjp_bounds``, ``vjp_params`` and ``loss_and_grad(...,
bounds=True)``, torch's autograd and JAX's transforms alike); the NumPy map for the other backends, to float64's
rounding; the plain map where nothing binds.  Attention with bounds: test_box_attention.py; rows with bad totals,
bounds or scores: test_box_edges.py; the shared rules: test_box_rules.py; the reference: test_box_reference.py.
"""

from __future__ import annotations

import math
from functools import lru_cache

import mpmath
import numpy as np
import pytest

import numeric as nm
from derive.box import box_loss, box_loss_gradients, solve_box
from derive.reference import compiled
from tests.backends import NumpyBackend, backend_params
from tests.constraints.cases import IDS, MAPS
from tests.numeric.conftest import case_derivation

INF = math.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")
#: how close another backend's float64 values are to the NumPy map's
TO_NUMPY = 1e-13


def _along_axis(seed=0):
    """Scores ``(2, 6, 3)`` along axis 1 with a masked score, bounds of the scores' shape (some infinite) and totals
    of size 1 along the axis; every row can hold its total."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, 3)) * 1.5
    x[1, 4, 2] = -INF
    upper = rng.choice([0.15, 0.3, 0.6, INF], size=x.shape)
    upper[:, :2] = 0.5
    total = np.array([[[0.8, 1.0, 0.6]], [[0.9, 0.7, 1.0]]])
    return x, upper, total


def _rows():
    """Two rows with a saturated bound each (entry 0), away from kinks (no entry at 0 or at its bound by a hair);
    a target inside the box, off its bounds, with sums exact in binary."""
    x = np.array([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, INF], [0.3, 0.25, 0.3, 1.0, 0.3]])
    total = np.array([[0.875], [1.0]])
    y = np.array([[0.25, 0.25, 0.125, 0.125, 0.125], [0.25, 0.125, 0.25, 0.25, 0.125]])
    return x, upper, total, y


def _finite_rows():
    """Three rows away from kinks with every bound finite (for gradient checks, which move every bound): entry 0
    saturated in each."""
    x = np.array([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0], [2.5, 0.1, 0.5, 0.2, -0.3]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, 4.0], [0.3, 0.25, 0.3, 1.0, 0.3], [0.3, 1.0, 1.0, 0.9, 0.8]])
    total = np.array([[0.9], [1.0], [0.95]])
    return x, upper, total


@lru_cache(maxsize=None)
def _reference_along_axis(name: str, items: tuple, seed: int = 0) -> np.ndarray:
    """:func:`derive.box.solve_box` of every row of ``_along_axis(seed)`` along axis 1 (``items``: the map's
    parameters; an alpha given as a row of 3 takes one value per column)."""
    x, upper, total = _along_axis(seed)
    out = np.zeros(x.shape)
    for b in range(2):
        for j in range(3):
            params = {k: (v[j] if isinstance(v, tuple) else v) for k, v in items}
            dv, rest = case_derivation(name, params)
            ref = solve_box(dv, x[b, :, j].tolist(), upper=upper[b, :, j].tolist(), total=float(total[b, 0, j]),
                            digits=30, **rest)
            out[b, :, j] = [float(v) for v in ref.p]
    return out


def _central(f, a, dy, h=1e-6, where=None):
    """``d <f(a), dy> / da`` by central differences, entry by entry of ``a`` (``where``: only those entries, 0
    elsewhere)."""
    out = np.zeros(np.shape(a))
    for i in np.ndindex(out.shape):
        if where is not None and not where[i]:
            continue
        up, down = np.array(a, dtype=np.float64), np.array(a, dtype=np.float64)
        up[i] += h
        down[i] -= h
        out[i] = float(((np.asarray(f(up)) - np.asarray(f(down))) * dy).sum()) / (2 * h)
    return out


def _call(backend, name, params, x, axis=-1, **bounds):
    """The map ``name`` with ``bounds`` on ``backend``, NumPy arrays in and out."""
    m = backend.get_map(name, **{k: backend.array(v) if isinstance(v, np.ndarray) else v for k, v in params.items()})
    out = backend.call(m, backend.array(x), axis, **{k: backend.array(v) for k, v in bounds.items()})
    return backend.numpy(out)


def _map_grads(backend, name, params, x, upper, total, dy, axis=-1):
    """The gradients of ``<m(x, upper=, total=), dy>`` in the scores, the bounds, the total and each parameter given
    as an array (in that order), as NumPy arrays: NumPy's ``vjp``, ``vjp_bounds`` and ``vjp_params``, torch's and
    JAX's autodiff."""
    arrays = {k: v for k, v in params.items() if isinstance(v, np.ndarray)}
    if backend.name == "numpy":
        m = nm.get_map(name, **params)
        p = m(x, axis=axis, upper=upper, total=total)
        b = m.vjp_bounds(p, dy, axis=axis, upper=upper, total=total)
        out = (m.vjp(p, dy, axis=axis, upper=upper, total=total), b["upper"], b["total"].reshape(total.shape))
        grads = m.vjp_params(p, dy, axis=axis, reduce=True, upper=upper, total=total) if arrays else {}
        return out + tuple(grads[k] for k in arrays)

    def f(x, u, c, *values):
        m = backend.get_map(name, **{**params, **dict(zip(arrays, values))})
        return (backend.call(m, x, axis, upper=u, total=c) * backend.array(dy)).sum()

    return backend.grad(f, *(backend.array(a) for a in (x, upper, total, *arrays.values())))


def _loss_grads(backend, name, params, x, target, upper, total, reduction="sum"):
    """``(loss, d/dx, d/dupper, d/dtotal)`` of the bounded Fenchel-Young loss on ``backend``, as NumPy arrays
    (NumPy's ``loss_and_grad(..., bounds=True)``, the others' autodiff)."""
    if backend.name == "numpy":
        value, grad, b = nm.get_map(name, **params).loss_and_grad(x, target, upper=upper, total=total,
                                                                 reduction=reduction, bounds=True)
        return np.asarray(value), grad, b["upper"], b["total"].reshape(np.shape(total)[:-1] + (-1,))[..., 0]
    m, t = backend.get_map(name, **params), backend.array(target)

    def f(x, u, c):
        return backend.loss(m, x, t, reduction=reduction, upper=u, total=c)

    args = tuple(backend.array(a) for a in (x, upper, total))
    gx, gu, gc = backend.grad(f, *args)
    return backend.numpy(f(*args)), gx, gu, gc[..., 0]


# ---------------------------------------------------------------------------------------------- values
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_values_along_an_axis_match_the_reference(backend, name, params):
    x, upper, total = _along_axis()
    p = _call(backend, name, params, x, axis=1, upper=upper, total=total)
    assert p.dtype == np.float64
    np.testing.assert_allclose(p, _reference_along_axis(name, tuple(params.items())), rtol=0, atol=1e-12)
    assert np.all(p <= upper) and p[1, 4, 2] == 0
    np.testing.assert_allclose(p.sum(axis=1, keepdims=True), total, rtol=0, atol=1e-12)
    if backend.name != "numpy":
        want = nm.get_map(name, **params)(x, axis=1, upper=upper, total=total)
        np.testing.assert_allclose(p, want, rtol=0, atol=TO_NUMPY)
    m = backend.get_map(name, **params)  # float32 scores (bounds in float64)
    p32 = backend.numpy(backend.call(m, backend.array(x, np.float32), 1, upper=backend.array(upper),
                                     total=backend.array(total)))
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, p, rtol=0, atol=3e-6)


@pytest.mark.parametrize("backend", backend_params(only=("torch",)), indirect=True)
def test_bfloat16_scores_keep_their_dtype(backend):
    x, upper, total = _along_axis(5)
    m = backend.get_map("entmax15")
    half = backend.call(m, backend.array(x).to(backend.torch.bfloat16), 1, upper=backend.array(upper),
                        total=backend.array(total))
    assert half.dtype == backend.torch.bfloat16
    want = nm.entmax15(x, axis=1, upper=upper, total=total)
    np.testing.assert_allclose(half.float().numpy(), want, rtol=0, atol=2e-2)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_the_family_per_row_across_one_with_bounds(backend):
    """alpha per row (size 1 along axis 1): 0.5 (dense), 1 (softmax), 1.7 (sparse), solved together."""
    x, upper, total = _along_axis()
    alpha = (0.5, 1.0, 1.7)
    p = _call(backend, "entmax", {"alpha": np.array(alpha).reshape(1, 1, 3)}, x, axis=1, upper=upper, total=total)
    np.testing.assert_allclose(p, _reference_along_axis("entmax", (("alpha", alpha),)), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_no_binding_bound_is_the_plain_map(backend, name, params):
    x = np.random.default_rng(2).standard_normal((4, 7))
    plain = _call(backend, name, params, x)
    for bounds in ({"upper": INF, "total": 1.0}, {"upper": 2.0}):  # the box path, the plain map's values
        np.testing.assert_allclose(_call(backend, name, params, x, **bounds), plain, rtol=0, atol=1e-14)
    m, xb = backend.get_map(name, **params), backend.array(x)
    for keywords in ({"upper": None}, {"total": 1.0}, {"total": 1}, {"upper": None, "total": 1.0}):
        assert np.array_equal(backend.numpy(backend.call(m, xb, -1, **keywords)), plain)  # the plain path itself
    labels = backend.array(np.array([0, 3, 6, 1]))
    assert np.array_equal(backend.numpy(backend.loss(m, xb, labels, upper=None, total=1.0)),
                          backend.numpy(backend.loss(m, xb, labels)))


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_budget_sparsemax(backend):
    x = np.array([[3.0, 2.9, 0.1, 0.0], [0.4, 0.3, 0.2, 0.1]])
    p = _call(backend, "sparsemax", {}, x, upper=np.asarray(1.0), total=np.asarray(2.0))
    np.testing.assert_allclose(p[0], [1, 1, 0, 0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(p[1], x[1] - (x[1].sum() - 2) / 4, rtol=0, atol=1e-15)  # every entry free


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_bounds_summing_to_the_total_within_rounding_are_feasible(backend):
    """A decoder's remaining fertilities sum to the total only up to rounding (``1 - 1e-16``): feasible, every entry
    saturated (it raised "infeasible bounds ... sum to 1 < total = 1")."""
    upper = np.array([0.1, 0.2, 0.7 - 1e-16])
    assert upper.sum() < 1
    for name in ("softmax", "sparsemax", "entmax15"):
        p = _call(backend, name, {}, np.array([0.3, 0.1, 0.5]), upper=upper)
        np.testing.assert_allclose(p, upper, rtol=0, atol=2e-16)
    near = np.array([0.1, 0.2, 0.7 - 1e-12])  # within sqrt(eps): the total clipped
    np.testing.assert_allclose(_call(backend, "sparsemax", {}, np.zeros(3), upper=near), near, rtol=0, atol=2e-16)
    with pytest.raises(ValueError, match="infeasible bounds"):  # beyond sqrt(eps) = 1.5e-8 of the total
        _call(backend, "sparsemax", {}, np.zeros(3), upper=np.array([0.1, 0.2, 0.7 - 1e-7]))


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_fully_masked_and_nan_rows_with_bounds(backend):
    """A fully masked row gives zeros with bounds as without (it was refused as "infeasible", which made
    ``upper=`` unusable with padding masks); a NaN row gives NaN and NaN derivatives (they were 0, or refused)."""
    x = np.array([[-INF, -INF, -INF], [0.0, 1.0, np.nan], [0.0, 1.0, 2.0]])
    for name in ("softmax", "sparsemax", "entmax15"):
        p = _call(backend, name, {}, x, upper=np.asarray(0.6))
        np.testing.assert_array_equal(p[0], 0)
        assert np.isnan(p[1]).all() and np.all(np.isfinite(p[2]))
        if backend.name == "numpy":
            d = nm.get_map(name).vjp(p, np.ones_like(p), upper=0.6)
        else:
            m = backend.get_map(name)
            d = backend.grad(lambda s: backend.call(m, s, -1, upper=0.6).sum(), backend.array(x))
        np.testing.assert_array_equal(d[0], 0)
        assert np.isnan(d[1]).all() and np.all(np.isfinite(d[2]))


# ----------------------------------------------------------------------------------------- derivatives
def _derivative_cases():
    """``(axis, x, upper, total, dy)``: ``_rows`` along the last axis and ``_along_axis`` along axis 1, each with a
    cotangent drawn from one generator."""
    rng = np.random.default_rng(4)
    return [(axis, x, upper, total, rng.standard_normal(x.shape))
            for axis, (x, upper, total) in ((-1, _rows()[:3]), (1, _along_axis()))]


@lru_cache(maxsize=None)
def _map_central(name: str, items: tuple, case: int):
    """Central differences of ``<m(x, upper=, total=), dy>`` (the NumPy map) in the scores, the finite bounds and
    the total, for case 0 or 1 of :func:`_derivative_cases` (computed once for every backend)."""
    m = nm.get_map(name, **dict(items))
    axis, x, upper, total, dy = _derivative_cases()[case]
    finite = np.isfinite(upper) & np.isfinite(x)
    return (_central(lambda a: m(a, axis=axis, upper=upper, total=total), x, dy, where=np.isfinite(x)),
            _central(lambda a: m(x, axis=axis, upper=np.where(finite, a, upper), total=total),
                     np.where(finite, upper, 0.0), dy, where=finite),
            _central(lambda a: m(x, axis=axis, upper=upper, total=a), total, dy))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_derivatives_are_central_differences_of_the_map(backend, name, params):
    """The gradients of ``<p, dy>`` in the scores, the finite bounds and the total, in rows and along an axis,
    against central differences of the NumPy map; the other backends' against NumPy's ``vjp`` and
    ``vjp_bounds``."""
    for case, (axis, x, upper, total, dy) in enumerate(_derivative_cases()):
        gx, gu, gc = _map_grads(backend, name, params, x, upper, total, dy, axis)
        finite = np.isfinite(upper) & np.isfinite(x)
        fd_x, fd_u, fd_c = _map_central(name, tuple(params.items()), case)
        np.testing.assert_allclose(gx, fd_x, rtol=0, atol=1e-7)
        np.testing.assert_allclose(np.where(finite, gu, 0), fd_u, rtol=0, atol=1e-7)
        np.testing.assert_allclose(gc, fd_c, rtol=0, atol=1e-7)
        if backend.name != "numpy":
            want = _map_grads(NumpyBackend(), name, params, x, upper, total, dy, axis)
            for got, w in zip((gx, gu, gc), want):
                np.testing.assert_allclose(got, w, rtol=0, atol=1e-12)
    _, x, upper, total, dy = _derivative_cases()[0]
    gx, gu, gc = _map_grads(backend, name, params, x, upper, total, dy)
    assert np.all(gu[:, 0] != 0)  # entry 0 saturates in both rows: its bound has a gradient
    gx, gu, gc = _map_grads(backend, name, params, *_rows()[:3], np.ones((2, 5)))  # sum p = total, whatever moves
    np.testing.assert_allclose(gx, 0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(gu, 0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(gc, 1, rtol=0, atol=1e-14)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_checks_in_the_scores_the_bounds_and_the_total(backend, name, params):
    """The framework's own check against central differences (``gradcheck``, ``check_grads``), to second order for
    entmax15."""
    m = backend.get_map(name, **params)
    backend.check_grads(lambda x, u, c: backend.call(m, x, -1, upper=u, total=c),
                        *(backend.array(a) for a in _finite_rows()), order=2 if name == "entmax15" else 1,
                        reverse_only=True)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_alpha_per_row_on_both_sides_of_one(backend):
    """alpha per row, 0.8 (dense) and 1.3 (sparse), solved together: the gradient in (scores, bounds, total, alpha)
    against central differences of the NumPy map of each row's alpha."""
    x, upper, total, _ = _rows()
    alpha = np.array([[0.8], [1.3]])
    upper = np.where(np.isfinite(upper), upper, 5.0)
    dy = np.random.default_rng(5).standard_normal(x.shape)
    got = _map_grads(backend, "entmax", {"alpha": alpha}, x, upper, total, dy)
    args = [x, upper, total, alpha]
    for k, g in enumerate(got):
        def f(a, k=k):
            b = list(args)
            b[k] = a
            return nm.entmax(b[0], b[3], upper=b[1], total=b[2])

        np.testing.assert_allclose(g, _central(f, args[k], dy), rtol=0, atol=1e-7)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_check_with_alpha_per_row_across_one(backend):
    x, upper, total = (backend.array(a) for a in _finite_rows())
    alpha = backend.array(np.array([[0.8], [1.3], [1.0]]))

    def f(x, u, c, a):
        return backend.call(backend.get_map("entmax", alpha=a), x, -1, upper=u, total=c)

    backend.check_grads(f, x, upper, total, alpha, order=1)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_float32_gradient_in_alpha_is_computed_in_float64(backend):
    """The gradient in alpha of float32 scores equals float64's to float32's resolution (the printed
    ``d omega'/d alpha`` cancels near alpha = 1 in float32), as the plain map's."""
    x, upper, total = _finite_rows()
    alpha = np.array([[0.8], [1.3], [1.0]])

    def grad(dtype):
        def f(a):
            m = backend.get_map("entmax", alpha=a)
            p = backend.call(m, backend.array(x, dtype), -1, upper=backend.array(upper, dtype),
                             total=backend.array(total, dtype))
            return p[:, 1].sum()

        return backend.grad(f, backend.array(alpha, dtype))

    np.testing.assert_allclose(grad(np.float32).astype(np.float64), grad(np.float64), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_scalar_alpha_and_bounds_in_a_broadcast_shape(backend):
    """A number's gradient is the sum over the rows; bounds and totals broadcast to the scores get the sums over
    their broadcast entries: against central differences of the NumPy map."""
    x = _along_axis(5)[0][:, :, :2]  # (2, 6, 2) along axis 1
    upper = np.array([0.3, 0.5, 0.25, 0.6, 0.35, 0.4]).reshape(6, 1)  # per score, shared by columns and examples
    total = np.array([[[0.9, 0.8]]])  # per column
    alpha = np.asarray(1.3)
    dy = np.random.default_rng(6).standard_normal(x.shape)
    xb = backend.array(x)

    def f(u, c, a):
        return (backend.call(backend.get_map("entmax", alpha=a), xb, 1, upper=u, total=c) * backend.array(dy)).sum()

    args = [upper, total, alpha]
    grads = backend.grad(f, *(backend.array(a) for a in args))
    for k, g in enumerate(grads):
        assert g.shape == args[k].shape

        def ref(a, k=k):
            b = list(args)
            b[k] = a
            return nm.entmax(x, float(b[2]), axis=1, upper=b[0], total=b[1])

        np.testing.assert_allclose(g, _central(ref, args[k], dy), rtol=0, atol=1e-8)


@pytest.mark.parametrize("backend", backend_params("jit"), indirect=True)
def test_jit_vmap_and_traced_infeasible_rows(backend):
    """Traced bounds cannot be read: a row they cannot fill is NaN, the other rows are the map."""
    x, upper, total, _ = _rows()
    args = tuple(backend.array(a) for a in (x, upper, total))
    m, jm = nm.get_map("entmax15"), backend.get_map("entmax15")
    want = m(x, upper=upper, total=total)
    f = backend.jit(lambda x, u, c: jm(x, upper=u, total=c))
    np.testing.assert_allclose(backend.numpy(f(*args)), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(backend.numpy(backend.jax.vmap(lambda x, u, c: jm(x, upper=u, total=c))(*args)), want,
                               rtol=0, atol=1e-12)  # (one row at a time)
    dy = np.random.default_rng(8).standard_normal(x.shape)
    gx, gu, gc = backend.jit(backend.jax.grad(lambda x, u, c: (jm(x, upper=u, total=c) * dy).sum(),
                                              argnums=(0, 1, 2)))(*args)
    np.testing.assert_allclose(gx, m.vjp(want, dy, upper=upper, total=total), rtol=0, atol=1e-12)
    np.testing.assert_allclose(gu, m.vjp_bounds(want, dy, upper=upper, total=total)["upper"], rtol=0, atol=1e-12)
    short = upper.copy()
    short[1] = 0.1
    got = backend.numpy(f(args[0], backend.array(short), args[2]))
    assert np.all(np.isnan(got[1]))
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ loss
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_with_bounds_matches_the_reference(backend, name, params):
    """The loss per row and its gradients in the scores, the bounds and the total against :mod:`derive.box`'s, for
    a distribution and for labels; ``"mean"`` is ``"sum"`` over the rows."""
    x, upper, total, y = _rows()
    labels = np.array([0, 2])
    room = np.where(np.arange(5) == labels[:, None], 1.0, upper)  # (room for the label's 1)
    dv, rest = case_derivation(name, params)
    for target, u, c, onehot in ((y, upper, total, y), (labels, room, np.ones((2, 1)), np.eye(5)[labels])):
        value = backend.numpy(backend.loss(backend.get_map(name, **params), backend.array(x), backend.array(target),
                                           reduction="none", upper=backend.array(u), total=backend.array(c)))
        _, gx, gu, gc = _loss_grads(backend, name, params, x, target, u, c)
        for i in range(2):
            ref_args = (dv, x[i].tolist(), onehot[i].tolist())
            kw = dict(upper=u[i].tolist(), total=float(c[i, 0]), digits=30, **rest)
            assert abs(value[i] - float(box_loss(*ref_args, **kw))) < 1e-12
            ref = box_loss_gradients(*ref_args, **kw)
            np.testing.assert_allclose(gx[i], [float(v) for v in ref["scores"]], rtol=0, atol=1e-12)
            np.testing.assert_allclose(gu[i], [float(v) for v in ref["upper"]], rtol=0, atol=1e-10)
            assert abs(gc[i] - float(ref["total"])) < 1e-10
        if backend.name != "numpy":
            want = _loss_grads(NumpyBackend(), name, params, x, target, u, c)
            for got, w in zip((value.sum(), gx, gu, gc), want):
                np.testing.assert_allclose(got, w, rtol=0, atol=TO_NUMPY if got is gx else 1e-12)
        mean = _loss_grads(backend, name, params, x, target, u, c, reduction="mean")
        assert float(mean[0]) == pytest.approx(value.mean(), abs=1e-15)
        np.testing.assert_allclose(mean[2], gu / 2, rtol=1e-15, atol=1e-300)
    assert np.all(_loss_grads(backend, name, params, x, y, upper, total)[2][:, 0] > 0)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_gradients_in_the_bounds_are_central_differences(backend, name, params):
    """``d loss / d u`` by central differences of the NumPy loss (the target fixed inside the box); ``d loss / d c``
    with the target scaled to the total, ``tau + sum_i (omega'(y_i) - s_i) y_i / c``."""
    x, upper, total, y = _rows()
    m = nm.get_map(name, **params)
    _, _, gu, gc = _loss_grads(backend, name, params, x, y, upper, total)
    finite = np.isfinite(upper)
    fd = _central(lambda a: m.loss(x, y, upper=np.where(finite, a, INF), total=total, reduction="sum"),
                  np.where(finite, upper, 5.0), 1.0, where=finite)
    np.testing.assert_allclose(np.where(finite, gu, 0), fd, rtol=0, atol=1e-7)
    op = compiled(*case_derivation(name, params)).d1  # omega' in mpmath
    for i in range(2):
        e = np.zeros((2, 1))
        e[i] = 1.0
        fd_c = _central(lambda c: m.loss(x, y * (c / total), upper=upper, total=c, reduction="none"), total,
                        np.eye(2)[i])[i, 0]
        extra = sum((float(op(mpmath.mpf(v))) - s) * v for v, s in zip(y[i], x[i])) / total[i, 0]
        assert fd_c == pytest.approx(gc[i] + extra, abs=1e-7)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_loss_gradient_checks_in_the_bounds_and_alpha(backend):
    """The loss's gradients in the scores, finite bounds and alpha per row (across 1) by the framework's check
    (the target fixed inside the box); to second order in the scores and bounds for entmax15."""
    x, upper, _, y = _rows()
    upper = np.where(np.isfinite(upper), upper, 2.0)
    y = np.array([[0.25, 0.25, 0.2, 0.15, 0.15], [0.25, 0.125, 0.25, 0.25, 0.125]])
    yb = backend.array(y)

    def loss(x, u, a):
        return backend.loss(backend.get_map("entmax", alpha=a), x, yb, reduction="none", upper=u)

    backend.check_grads(loss, *(backend.array(a) for a in (x, upper, np.array([[0.7], [1.4]]))), order=1)
    m = backend.get_map("entmax15")
    backend.check_grads(lambda x, u: backend.loss(m, x, yb, reduction="sum", upper=u),
                        *(backend.array(a) for a in (x, upper)), order=2)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_loss_gradient_in_alpha_per_row(backend):
    """The envelope theorem's gradient in alpha per row (0.8 and 1.3) against central differences of NumPy's
    loss."""
    x, upper, total, y = _rows()
    alpha = np.array([[0.8], [1.3]])

    def loss(a):
        return backend.loss(backend.get_map("entmax", alpha=a), backend.array(x), backend.array(y), reduction="sum",
                            upper=backend.array(upper), total=backend.array(total))

    g = backend.grad(loss, backend.array(alpha))
    assert g.shape == alpha.shape
    fd = _central(lambda a: nm.get_map("entmax", alpha=a).loss(x, y, upper=upper, total=total, reduction="sum"),
                  alpha, 1.0)
    np.testing.assert_allclose(g, fd, rtol=0, atol=1e-8)


@pytest.mark.parametrize("backend", backend_params("jit"), indirect=True)
def test_loss_second_derivatives_under_jit(backend):
    """The loss's gradients ``(p - y, mu, tau)`` differentiated along a random direction of (scores, bounds,
    total), against central differences of NumPy's (``Map.loss_and_grad(..., bounds=True)``; under jit: a moved
    total leaves the target outside the box, which an eager call refuses)."""
    jax = backend.jax
    x, upper, total, y = _rows()
    m, jm = nm.get_map("entmax15"), backend.get_map("entmax15")
    finite = np.isfinite(upper)

    def loss(x, u, c):  # (an infinite bound stays infinite: its finite stand-in is not moved)
        return backend.loss(jm, x, backend.array(y), reduction="sum", upper=backend.xp.where(finite, u, INF), total=c)

    def grads(x, u, c):  # (p, mu, tau): the gradients less the target, which moves with the total to stay inside
        yc = y * c / total
        _, gx, bounds = m.loss_and_grad(x, yc, upper=np.where(finite, u, INF), total=c, reduction="sum", bounds=True)
        return np.concatenate([gx + yc, bounds["upper"], bounds["total"][:, None]], axis=1)

    rng = np.random.default_rng(7)
    args = (x, np.where(finite, upper, 5.0), total)
    tangents = (rng.standard_normal(x.shape), rng.standard_normal(x.shape) * finite, rng.standard_normal(total.shape))
    _, dg = jax.jvp(backend.jit(jax.grad(loss, argnums=(0, 1, 2))), tuple(backend.array(a) for a in args),
                    tuple(backend.array(t) for t in tangents))
    h = 1e-6
    fd = (grads(*(a + h * t for a, t in zip(args, tangents))) - grads(*(a - h * t for a, t in zip(args, tangents))))
    np.testing.assert_allclose(np.concatenate([np.asarray(d) for d in dg], axis=1), fd / (2 * h), rtol=0, atol=1e-8)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_loss_checks_the_target_against_the_box(backend):
    x = backend.array(np.zeros((1, 3)))
    sparsemax, softmax = backend.get_map("sparsemax"), backend.get_map("softmax")
    y = backend.array(np.array([[0.5, 0.3, 0.2]]))
    with pytest.raises(ValueError, match="summing to its total"):
        backend.loss(sparsemax, x, y, total=2.0)
    with pytest.raises(ValueError, match="within the upper bounds; an entry exceeds its bound by 0.1"):
        backend.loss(sparsemax, x, y, upper=0.4)
    with pytest.raises(ValueError, match="within the upper bounds"):  # a label's one-hot over its bound
        backend.loss(softmax, x, backend.array(np.array([1])), upper=0.5)
    value = backend.loss(sparsemax, backend.array(np.array([[3.0, 2.9, 0.1, 0.0]])),
                         backend.array(np.array([[1.0, 1.0, 0, 0]])), upper=1.0, total=2.0, reduction="none")
    assert float(backend.numpy(value)[0]) == pytest.approx(0.0, abs=1e-15)  # budget sparsemax at its own top-2


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_bounds_are_checked_by_name(backend):
    x = np.zeros((2, 3))

    def call(name, scores=x, **bounds):
        m = backend.get_map(name)
        return backend.call(m, backend.array(scores), -1, **{k: backend.array(v) if isinstance(v, np.ndarray) else v
                                                              for k, v in bounds.items()})

    with pytest.raises(ValueError, match=r"infeasible bounds: in row 1 .* sum to 0.9 < total = 1"):
        call("sparsemax", upper=np.array([[0.5], [0.3]]))
    with pytest.raises(ValueError, match="infeasible"):  # a masked score's bound does not count
        call("softmax", np.array([[0.0, -INF]]), upper=0.6)
    with pytest.raises(ValueError, match="upper must be >= 0"):
        call("sparsemax", upper=np.array([1.0, -1.0, 1.0]))
    for total in (-1.0, INF, np.array([[1.0], [INF]])):
        with pytest.raises(ValueError, match="total must be finite and > 0"):
            call("sparsemax", total=total)
    with pytest.raises(ValueError, match="total must be finite and > 0, got -0.5"):
        call("entmax15", total=-0.5)
    for name in ("softmax", "sparsemax", "entmax15"):  # (a total of 0: only p = 0, at the edge, refused)
        with pytest.raises(ValueError, match="total must be finite and > 0, got 0.0"):
            call(name, upper=1.0, total=0.0)
    with pytest.raises(ValueError, match="upper of shape .* does not broadcast"):
        call("sparsemax", upper=np.ones(4))
    with pytest.raises(ValueError, match=f"must have size 1 along {backend.axis_word}"):
        call("sparsemax", total=np.ones((2, 3)))
    with pytest.raises(TypeError, match="upper must be a real number"):
        call("sparsemax", upper="1")
    if backend.name == "numpy":  # (NumPy's forward, which the call runs, refuses a total of 0 by itself)
        for name in ("softmax", "sparsemax", "entmax15"):
            with pytest.raises(ValueError, match=r"total must be finite and > 0, got 0.0"):
                nm.get_map(name).forward(np.array([[0.3, -1.0, 2.0], [0.0, 0.5, 1.0]]), upper=1.0,
                                         total=np.array([[0.0], [1.0]]))
