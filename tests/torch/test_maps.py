"""numeric.torch's maps against numeric's NumPy maps (values), autograd (gradcheck, gradgradcheck) and the map's properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.torch import TorchMap, entmax, entmax15, get_map, softmax, sparsemax  # noqa: E402

from .conftest import IDS, MAPS  # noqa: E402
from tests.numeric.conftest import hard_rows  # noqa: E402

INF = math.inf


def _scores(seed, shape=(12, 9), scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def _numpy(name, params, x, axis=-1):
    return nm.get_map(name, **params)(x.detach().numpy(), axis=axis)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("threshold", ["auto", "root", "sort"])
def test_values_match_numpy(name, params, threshold):
    m = nm.get_map(name, **params)
    if threshold == "sort" and m.module.THRESHOLD != "sort":
        pytest.skip("sort rule only for sort maps")
    x = hard_rows(_scores(0))
    p = TorchMap(name, threshold=threshold, **params)(x)
    ref = m(x.numpy())
    assert p.dtype == torch.float64 and p.shape == x.shape
    assert np.array_equal(np.isnan(p.numpy()), np.isnan(ref))
    np.testing.assert_allclose(p.numpy(), ref, rtol=0, atol=1e-12, equal_nan=True)
    assert torch.all(p[2] == 0) and torch.all(torch.isnan(p[3])) and p[1, 3] == 0


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_values_along_other_dims_and_long_rows(name, params):
    x = _scores(1, shape=(3, 300, 2))
    np.testing.assert_allclose(TorchMap(name, **params)(x, dim=1).numpy(), _numpy(name, params, x, axis=1), rtol=0, atol=1e-12)
    long = _scores(2, shape=(4, 5000), scale=2.0)
    np.testing.assert_allclose(TorchMap(name, **params)(long).numpy(), _numpy(name, params, long), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_float32_close_to_float64(name, params):
    x = _scores(3)
    p32 = TorchMap(name, **params)(x.float())
    assert p32.dtype == torch.float32
    np.testing.assert_allclose(p32.double().numpy(), _numpy(name, params, x), rtol=0, atol=2e-5)
    np.testing.assert_allclose(p32.sum(-1).double().numpy(), 1, atol=1e-5)


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@pytest.mark.parametrize("shift", [1e3, 1e5, -1e5])
def test_float32_far_rows(name, params, shift):
    """Scores far from 0 in float32 (a grid of 1/4 shifted, exact in float32): the map of the unshifted scores,
    to float32's rounding (the solvers shift each row by its maximum first)."""
    x = torch.round(_scores(4) * 4) / 4
    p32 = TorchMap(name, **params)((x + shift).float())
    np.testing.assert_allclose(p32.double().numpy(), _numpy(name, params, x), rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [40.0, 1000.0, 1e6])
def test_constant_rows_at_huge_alpha(alpha, dtype):
    """``(1/n)**(alpha - 1)`` below the normal range (``c = p_max**(1/k)`` underflows; the rows are solved in
    ``log(a / c)``): a constant row is uniform, to the rounding of its sum, with alpha a number or per row."""
    n = 346
    x = torch.zeros(3, n, dtype=dtype)
    x[1] = -1e6
    x[2, -1] = -INF
    eps = torch.finfo(dtype).eps
    for a in (alpha, torch.full((3, 1), alpha, dtype=dtype)):
        p = entmax(x, a).double().numpy()
        for row, count in enumerate((n, n, n - 1)):
            assert (p[row, :count] == p[row, 0]).all() and (p[row, count:] == 0).all()
            np.testing.assert_allclose(p[row, :count], 1 / count, rtol=eps * (16 + count / 8), atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_from_the_threshold_at_huge_alpha(dtype):
    """The weights attention's backward rebuilds from the forward's threshold (``TorchMap.at``) are the forward's,
    also on rows whose ``c = p_max**(1/k)`` underflows, which ``tau`` cannot carry (solved again)."""
    x = _scores(15, shape=(6, 346), scale=0.01).to(dtype)
    x[0] = 0.0
    x[1, ::2] = x[1, 1::2]  # ties
    solver = TorchMap("entmax_sparse")._solver
    for alpha in (1.5, 3.0, 1000.0, [[1000.0], [1.3], [1000.0], [4.0], [20.0], [1e6]]):
        params = (torch.tensor(alpha, dtype=dtype),)
        p, t = solver.solve(x, params)
        torch.testing.assert_close(solver.at(x, t, params), p, rtol=0, atol=8 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("alpha", [20.0, 40.0])
def test_float32_rows_at_huge_alpha_match_float64(alpha):
    """float32 rows whose ``c`` underflows in float32 but not in float64: two different solves agree to float32."""
    x = (_scores(14, shape=(16, 300), scale=0.01)).float()
    p32 = entmax(x, alpha).double().numpy()
    np.testing.assert_allclose(p32, _numpy("entmax", {"alpha": alpha}, x.double()), rtol=0, atol=4e-7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("name", "params"), MAPS[:4], ids=IDS[:4])
def test_half_precision_computes_in_float32(name, params, dtype):
    x = _scores(4).to(dtype)
    p = TorchMap(name, **params)(x)
    assert p.dtype == dtype
    expected = _numpy(name, params, x.double())  # the map of the rounded scores
    np.testing.assert_allclose(p.double().numpy(), expected, rtol=0, atol=4 * torch.finfo(dtype).eps)
    xg = x.clone().requires_grad_()
    TorchMap(name, **params)(xg)[:, 0].sum().backward()
    assert xg.grad.dtype == dtype and torch.isfinite(xg.grad).all()


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_gradcheck_and_gradgradcheck(name, params):
    m = TorchMap(name, **params)
    x = _scores(5, shape=(4, 6), scale=1.5)
    x[1, 2] = -INF  # a masked score keeps zero gradient
    x = x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: m(x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: m(x), (x,))
    p = m(x)
    (g,) = torch.autograd.grad(p[:, 0].sum(), x)
    assert g[1, 2] == 0


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_backward_is_numpy_jvp(name, params):
    x = _scores(6).requires_grad_()
    v = _scores(7)
    m = TorchMap(name, **params)
    p = m(x)
    p.backward(v)
    ref = nm.get_map(name, **params).vjp(p.detach().numpy(), v.numpy())
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-12, atol=1e-12)


def test_fully_masked_row_has_zero_gradient():
    x = torch.tensor([[-INF, -INF, -INF], [0.0, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    for m in (softmax, sparsemax, entmax15, lambda x: entmax(x, 1.7)):
        x.grad = None
        m(x).sum().backward()
        assert torch.equal(x.grad[0], torch.zeros(3, dtype=torch.float64))


# --------------------------------------------------------------- parameters
def test_alpha_gradient_scalar_and_per_row():
    x = _scores(8, shape=(3, 7), scale=1.0)
    for alpha in (torch.tensor(1.6, dtype=torch.float64), torch.tensor([[1.2], [1.9], [3.5]], dtype=torch.float64)):
        a = alpha.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda x, a: entmax(x, a), (x.clone().requires_grad_(), a))
        assert torch.autograd.gradgradcheck(lambda x, a: entmax(x, a), (x.clone().requires_grad_(), a))


def test_alpha_gradient_matches_numpy_vjp_params_and_finite_differences():
    x = _scores(9, shape=(2, 3, 8), scale=1.0)
    alpha = torch.tensor([[[1.4]], [[2.6]]], dtype=torch.float64, requires_grad=True)  # per head, broadcast over rows
    v = _scores(10, shape=(2, 3, 8))
    p = entmax(x, alpha)
    (ga,) = torch.autograd.grad(p, alpha, v)
    assert ga.shape == alpha.shape
    ref = nm.get_map("entmax", alpha=alpha.detach().numpy()).vjp_params(p.detach().numpy(), v.numpy(), reduce=True)["alpha"]
    np.testing.assert_allclose(ga.numpy(), ref, rtol=1e-10)
    h = 1e-6
    for i in range(2):
        up, down = alpha.detach().clone(), alpha.detach().clone()
        up[i] += h
        down[i] -= h
        fd = ((entmax(x, up) - entmax(x, down)) * v).sum() / (2 * h)
        assert abs(float(fd) - float(ga[i])) < 1e-6 * max(1, abs(float(fd)))


def test_bound_tensor_parameter_keeps_its_graph():
    logit = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    alpha = (1 + torch.sigmoid(logit) * 2).reshape(2, 1)
    m = TorchMap("entmax", alpha=alpha)
    x, v = _scores(11, shape=(2, 5), scale=0.3), _scores(12, shape=(2, 5))
    (m(x) * v).sum().backward()
    leaf = alpha.detach().requires_grad_()
    (ga,) = torch.autograd.grad((entmax(x, leaf) * v).sum(), leaf)
    chain = ga.reshape(2) * 2 * torch.sigmoid(logit.detach()) * (1 - torch.sigmoid(logit.detach()))
    assert torch.all(chain != 0)
    torch.testing.assert_close(logit.grad, chain, rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha", [1.01, 1.3, 2.0, 5.0])
def test_alpha_values_match_numpy(alpha):
    x = _scores(12, shape=(20, 50))
    np.testing.assert_allclose(entmax(x, alpha).numpy(), _numpy("entmax", {"alpha": alpha}, x), rtol=0, atol=1e-12)
    per_row = torch.full((20, 1), alpha, dtype=torch.float64)
    per_row[::2] = 1.5
    ref = nm.get_map("entmax", alpha=per_row.numpy())(x.numpy())
    np.testing.assert_allclose(entmax(x, per_row).numpy(), ref, rtol=0, atol=1e-12)


# --------------------------------------------------------------- properties
finite_rows = arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)),
                     elements=st.floats(-20, 20, allow_nan=False, allow_infinity=False))


@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
@given(x=finite_rows, data=st.data())
def test_properties(name, params, x, data):
    m = TorchMap(name, **params)
    t = torch.from_numpy(x)
    p = m(t)
    # on the simplex
    assert torch.all(p >= 0)
    np.testing.assert_allclose(p.sum(-1).numpy(), 1, atol=1e-12)
    # the NumPy map
    np.testing.assert_allclose(p.numpy(), _numpy(name, params, t), rtol=0, atol=1e-12)
    # permutation equivariance
    perm = torch.from_numpy(np.array(data.draw(st.permutations(range(x.shape[1])))))
    np.testing.assert_allclose(m(t[:, perm]).numpy(), p[:, perm].numpy(), rtol=0, atol=1e-12)
    # shift invariance (by a number exact in binary, so the scores' spacings are kept)
    np.testing.assert_allclose(m(t + 4.0).numpy(), p.numpy(), rtol=0, atol=1e-12)
    # masking a score is removing it
    j = data.draw(st.integers(0, x.shape[1] - 1))
    if x.shape[1] > 1:
        masked = t.clone()
        masked[:, j] = -INF
        keep = [i for i in range(x.shape[1]) if i != j]
        pm = m(masked)
        assert torch.all(pm[:, j] == 0)
        np.testing.assert_allclose(pm[:, keep].numpy(), m(t[:, keep]).numpy(), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ errors
def test_errors_name_the_argument():
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match="floating"):
        softmax(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch tensor"):
        softmax(np.ones(3))
    with pytest.raises(ValueError, match="dim 2"):
        softmax(x, dim=2)
    with pytest.raises(ValueError, match="empty"):
        softmax(torch.ones(2, 0))
    with pytest.raises(ValueError, match="at least one dimension"):
        softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"parameter alpha = 0.0 is outside \(0.0, inf\)"):
        entmax(x, 0.0)
    with pytest.raises(ValueError, match="parameter alpha = -0.5 is outside"):
        entmax(x, torch.tensor([[1.5], [-0.5]]))
    with pytest.raises(ValueError, match="parameter alpha .* size 1 along dim"):
        entmax(x, torch.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="parameter alpha .* does not broadcast"):
        entmax(x, torch.full((4, 1), 1.5))
    with pytest.raises(TypeError, match="parameter alpha must be a real number"):
        entmax(x, "1.5")
    with pytest.raises(ValueError, match=r"no parameter\(s\) \['beta'\]"):
        TorchMap("entmax", beta=2.0)
    with pytest.raises(ValueError, match="needs a value for alpha"):
        TorchMap("entmax")(x)
    with pytest.raises(ValueError, match="no map named"):
        get_map("nosuchmap")
    with pytest.raises(ValueError, match="threshold"):
        TorchMap("softmax", threshold="sort")


def test_parameter_on_another_device_is_an_error():
    x = torch.randn(2, 3)
    alpha = torch.full((2, 1), 1.5, device="meta")
    with pytest.raises(ValueError, match="parameter alpha is on meta"):
        entmax(x, alpha)


def test_get_map_accepts_name_module_and_map():
    import numeric._generated.sparsemax as module

    x = torch.tensor([1.0, 0.5, -1.0])
    for mapping in ("sparsemax", module, TorchMap("sparsemax")):
        assert torch.equal(get_map(mapping)(x), torch.tensor([0.75, 0.25, 0.0]))
    rebound = get_map(TorchMap("entmax", alpha=1.5), alpha=2.0)
    assert torch.allclose(rebound(x), torch.tensor([0.75, 0.25, 0.0]))
    assert TorchMap("cube").name == "cube"


def test_a_misspelt_map_name_lists_the_builtins_and_the_closest():
    with pytest.raises(ValueError, match=r"no map named 'entmax1\.5' \(did you mean 'entmax15'\?\): built-ins are"):
        get_map("entmax1.5")
