"""normmax (``get_map("normmax")``, a map of the family :mod:`numeric.families.normmax` on every backend).

NumPy against its mpmath reference (:mod:`derive.normmax`): values, the Jacobian and the loss; the map's
properties (simplex, permutation invariance) by hypothesis.  torch and JAX against NumPy, each property written
once (:mod:`tests.backends`): values in float64 and float32, gradients against finite differences (twice) and
against NumPy's VJP, alpha per row, the loss and its gradient, attention with alpha per head, errors by name.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numeric as nm
from derive.normmax import normmax_jacobian, normmax_kkt_residual, normmax_loss, solve_normmax
from numeric.attention import attention, attention_backward
from tests.backends import backend_params

ALPHAS = [1.25, 2.0, 3.0, 7.5]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_values_along_an_axis_match_the_reference(alpha):
    rng = np.random.default_rng(int(alpha * 4))
    x = rng.standard_normal((3, 6, 2)) * 2
    x[1, 2, 0] = -np.inf
    p = nm.normmax(x, alpha, axis=1)
    for b in range(3):
        for j in range(2):
            ref, _ = solve_normmax(x[b, :, j].tolist(), alpha, digits=30)
            np.testing.assert_allclose(p[b, :, j], [float(v) for v in ref], rtol=0, atol=1e-12)
    assert p[1, 2, 0] == 0
    p32 = nm.normmax(x.astype(np.float32), alpha, axis=1)
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, p, rtol=0, atol=2e-6)


def test_alpha_per_row_and_edge_rows():
    x = np.array([[1.0, 0.5, -1.0, 0.2], [1.0, 0.5, -1.0, 0.2], [-np.inf] * 4, [0.0, np.nan, 1.0, 2.0]])
    alpha = np.array([[1.5], [4.0], [2.0], [2.0]])
    p = nm.normmax(x, alpha)
    for i in range(2):
        ref, _ = solve_normmax(x[i].tolist(), float(alpha[i, 0]), digits=30)
        np.testing.assert_allclose(p[i], [float(v) for v in ref], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(p[2], 0)
    assert np.isnan(p[3]).all()


@settings(max_examples=25, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 9), elements=st.floats(-30, 30)),
       alpha=st.sampled_from(ALPHAS), seed=st.integers(0, 2**16))
def test_simplex_permutation_and_kkt(x, alpha, seed):
    p = nm.normmax(x, alpha)
    assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-12
    perm = np.random.default_rng(seed).permutation(len(x))
    np.testing.assert_allclose(nm.normmax(x[perm], alpha), p[perm], rtol=0, atol=1e-13)
    np.testing.assert_allclose(nm.normmax(x + 7.25, alpha), p, rtol=0, atol=1e-12)
    assert normmax_kkt_residual(x.tolist(), p.tolist(), alpha, digits=20) < 1e-9


@pytest.mark.parametrize("alpha", ALPHAS)
def test_vjp_is_the_references_jacobian(alpha):
    x = np.array([[1.0, 0.5, -1.0, 0.2, 0.45], [0.3, 0.2, 0.1, 0.0, -0.1]])
    m = nm.get_map("normmax", alpha=alpha)
    p = m(x)
    v = np.random.default_rng(1).standard_normal(x.shape)
    got = m.vjp(p, v)
    for i in range(2):
        jac = np.array([[float(e) for e in row] for row in normmax_jacobian(x[i].tolist(), alpha, digits=30)])
        np.testing.assert_allclose(got[i], jac.T @ v[i], rtol=0, atol=1e-10)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_loss_matches_the_reference(alpha):
    x = np.array([[1.0, 0.5, -1.0, 0.2], [0.3, -np.inf, 0.1, 0.0]])
    y = np.array([[0.25, 0.5, 0.125, 0.125], [0.5, 0.0, 0.25, 0.25]])
    m = nm.get_map("normmax", alpha=alpha)
    value, grad = m.loss_and_grad(x, y, reduction="none")
    for i in range(2):
        with mpmath.workdps(30):
            want = normmax_loss(x[i].tolist(), y[i].tolist(), alpha, digits=30)
        assert value[i] == pytest.approx(float(want), abs=1e-12)
    np.testing.assert_allclose(grad, m(x) - y, rtol=0, atol=0)
    assert m.loss(x, m(x), reduction="sum") == pytest.approx(0, abs=1e-12)
    assert m.loss(np.array([[0.0, -np.inf]]), np.array([[0.5, 0.5]]), reduction="sum") == np.inf


def test_attention_with_normmax():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3))
    m = nm.get_map("normmax", alpha=np.array([[[1.5]], [[3.0]]]))  # per batch element
    out = attention(q, k, v, mapping=m, causal=True, block=2)
    s = np.where(np.tril(np.ones((5, 6), dtype=bool)), q @ np.swapaxes(k, -1, -2) / 2, -np.inf)
    np.testing.assert_allclose(out, m(s) @ v, rtol=0, atol=1e-14)
    dout = rng.standard_normal(out.shape)
    dq, _, _ = attention_backward(q, k, v, dout, mapping=m, causal=True)
    h = 1e-6
    fd = np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        up, down = q.copy(), q.copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = ((attention(up, k, v, mapping=m, causal=True) - attention(down, k, v, mapping=m, causal=True))
                   * dout).sum() / (2 * h)
    np.testing.assert_allclose(dq, fd, rtol=0, atol=1e-7)


def test_errors_by_name():
    with pytest.raises(ValueError, match="alpha > 1"):
        nm.normmax(np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="alpha > 1"):
        nm.get_map("normmax", alpha=np.array([[2.0], [0.5]]))
    with pytest.raises(ValueError, match="no box constraints"):
        nm.get_map("normmax")(np.zeros(3), upper=0.5)
    with pytest.raises(NotImplementedError, match="no gradient in alpha"):
        nm.get_map("normmax").vjp_params(np.full(3, 1 / 3), np.ones(3))
    assert repr(nm.get_map("normmax", alpha=3.0)) == "Map('normmax', threshold='auto', alpha=3.0)"
    assert nm.get_map(nm.get_map("normmax", alpha=3.0), alpha=2.0).params["alpha"] == 2.0


_NOT_A_NORMMAX_ALPHA = [np.inf, -np.inf, np.nan, 1.0, 0.5, -2.0]


def _normmax_calls(bad):
    """Each way of giving normmax an alpha, on each installed front end: ``(label, call)``."""
    calls = [("numpy normmax", lambda: nm.normmax(np.zeros(3), bad)),
             ("numpy get_map", lambda: nm.get_map("normmax", alpha=bad)),
             ("numpy per row", lambda: nm.normmax(np.zeros((2, 3)), np.array([[2.0], [bad]]))),
             ("numpy rebound", lambda: nm.get_map(nm.get_map("normmax"), alpha=bad))]
    try:
        import torch

        import numeric.torch as nt

        calls += [("torch normmax", lambda: nt.normmax(torch.zeros(3), alpha=bad)),
                  ("torch per row", lambda: nt.normmax(torch.zeros(2, 3), alpha=torch.tensor([[2.0], [bad]]))),
                  ("torch call", lambda: nt.get_map("normmax")(torch.zeros(3), alpha=bad))]
    except ImportError:  # pragma: no cover - torch not installed
        pass
    try:
        import jax.numpy as jnp

        import numeric.jax as nj

        calls += [("jax normmax", lambda: nj.normmax(jnp.zeros(3), alpha=bad)),
                  ("jax call", lambda: nj.get_map("normmax")(jnp.zeros(3), alpha=bad))]
    except ImportError:  # pragma: no cover - jax not installed
        pass
    return calls


@pytest.mark.parametrize("bad", _NOT_A_NORMMAX_ALPHA)
def test_an_alpha_outside_normmaxs_domain_is_named_as_normmaxs(bad):
    # alpha = inf or nan was refused by the entmax family it solves through: "outside (0.0, inf) for map 'entmax'"
    for label, call in _normmax_calls(bad):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "normmax needs alpha > 1 (finite)" in message and "entmax" not in message, (label, message)


def test_an_alpha_of_the_wrong_type_is_still_a_type_error():
    for bad in ("2", True, 2 + 1j):
        with pytest.raises(TypeError, match="parameter alpha must be a real number"):
            nm.get_map("normmax", alpha=bad)


# ------------------------------------------------------------------ every backend against NumPy
AUTODIFF = backend_params("autodiff")


def _scores():
    return np.random.default_rng(0).standard_normal((4, 7))


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_values_and_gradients_on_every_backend(backend, alpha):
    x = _scores()
    x[1, 3] = -np.inf
    want = nm.normmax(x, alpha)
    fn = backend.rj.normmax if backend.name == "jax" else backend.rt.normmax
    np.testing.assert_allclose(backend.numpy(fn(backend.array(x), alpha)), want, rtol=0, atol=1e-14)
    p32 = fn(backend.array(x, np.float32), alpha)
    assert backend.numpy(p32).dtype == np.float32
    np.testing.assert_allclose(backend.numpy(p32), want, rtol=0, atol=2e-6)
    if "jit" in backend.features:
        jitted = backend.jit(lambda z: fn(z, alpha))
        np.testing.assert_allclose(backend.numpy(jitted(backend.array(x))), want, rtol=0, atol=1e-14)
    x = backend.array(_scores())
    backend.check_grads(lambda z: fn(z, alpha), x, order=2)
    v = np.cos(np.arange(28.0)).reshape(4, 7)
    m = nm.get_map("normmax", alpha=alpha)
    got = backend.grad(lambda z: (fn(z, alpha) * backend.array(v)).sum(), x)
    np.testing.assert_allclose(got, m.vjp(m(_scores()), v), rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_alpha_per_row_along_an_axis_on_every_backend(backend):
    x = np.random.default_rng(1).standard_normal((3, 5, 2))
    alpha = np.array([[[1.5, 2.0]], [[3.0, 4.0]], [[2.0, 2.0]]])
    got = backend.call(backend.get_map("normmax", alpha=backend.array(alpha)), backend.array(x), axis=1)
    np.testing.assert_allclose(backend.numpy(got), nm.normmax(x, alpha, axis=1), rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0])
def test_loss_on_every_backend(backend, alpha):
    x = _scores()
    labels = np.array([0, 1, 2, 3])
    m = backend.get_map("normmax", alpha=alpha)
    want, grad = nm.get_map("normmax", alpha=alpha).loss_and_grad(x, labels, reduction="none")
    got = backend.loss(m, backend.array(x), backend.array(labels), reduction="none")
    np.testing.assert_allclose(backend.numpy(got), want, rtol=0, atol=1e-13)
    g = backend.grad(lambda z: backend.loss(m, z, backend.array(labels), reduction="sum"), backend.array(x))
    np.testing.assert_allclose(g, grad, rtol=0, atol=1e-14)
    backend.check_grads(lambda z: backend.loss(m, z, backend.array(labels)), backend.array(x), order=1)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_attention_with_alpha_per_head_on_every_backend(backend):
    """Causal attention with alpha per head equals the map on the masked scores times the values, and its gradient
    in the queries the map's own backward composed."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)) for _ in range(3))  # (batch, heads, length, dim)
    alpha = np.array([1.5, 3.0]).reshape(2, 1, 1)
    m = backend.get_map("normmax", alpha=backend.array(alpha))
    s = np.where(np.tril(np.ones((5, 5), dtype=bool)), q @ np.swapaxes(k, -1, -2) / 2, -np.inf)
    want = nm.normmax(s, alpha) @ v
    kb, vb, mask = backend.array(k), backend.array(v), backend.array(np.tril(np.ones((5, 5), dtype=bool)))
    out = backend.attention(backend.array(q), kb, vb, m, is_causal=True)
    np.testing.assert_allclose(backend.numpy(out), want, rtol=0, atol=1e-14)
    xp = backend.xp

    def composed(qb):
        o = backend.call(m, xp.where(mask, qb @ kb.mT / 2, -np.inf)) @ vb
        return (o * xp.cos(o)).sum()

    def fused(qb):
        o = backend.attention(qb, kb, vb, m, is_causal=True)
        return (o * xp.cos(o)).sum()

    np.testing.assert_allclose(backend.grad(fused, backend.array(q)), backend.grad(composed, backend.array(q)),
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_errors_by_name_on_every_backend(backend):
    fn = backend.rj.normmax if backend.name == "jax" else backend.rt.normmax
    for alpha in (0.9, 1.0):
        with pytest.raises(ValueError, match="alpha > 1"):
            fn(backend.array(np.zeros(3)), alpha)
    with pytest.raises(ValueError, match="no box constraints"):
        backend.call(backend.get_map("normmax"), backend.array(np.zeros(3)), upper=0.5)
    with pytest.raises((RuntimeError, ValueError), match="no gradient in alpha"):
        backend.grad(lambda a: fn(backend.array(_scores()), a).sum(), backend.array(2.0))


def test_torch_attention_by_blocks_and_gradcheck():
    """torch's blocked path (block=2) against the map composed, its gradient in the queries against the map's own
    backward composed, and gradcheck of attention in the queries."""
    torch = pytest.importorskip("torch")
    import numeric.torch as rt

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(3))
    m = rt.get_map("normmax", alpha=torch.tensor([[[1.5]], [[3.0]]], dtype=torch.float64))
    s = (q @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
    qg = q.clone().requires_grad_()
    out = rt.attention(qg, k, v, mapping=m, is_causal=True, block=2)
    torch.testing.assert_close(out, m(s) @ v, rtol=0, atol=1e-14)
    (gq,) = torch.autograd.grad((out * torch.cos(out)).sum(), qg)  # against the map's own backward, composed
    sg = (qg @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
    (want,) = torch.autograd.grad((m(sg) @ v * torch.cos(m(sg) @ v)).sum(), qg)
    torch.testing.assert_close(gq, want, rtol=0, atol=1e-13)
    small = q[:1, :, :3].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda q: rt.attention(q, k[:1, :, :3], v[:1, :, :3], mapping=m, block=2), (small,))


def test_the_entmax_package_agrees():
    torch = pytest.importorskip("torch")
    entmax = pytest.importorskip("entmax")
    import numeric.torch as rt

    x = torch.from_numpy(_scores())
    for alpha in (1.5, 2.0, 3.0):
        torch.testing.assert_close(rt.normmax(x, alpha), entmax.normmax_bisect(x, alpha=alpha, n_iter=200),
                                   rtol=0, atol=1e-14)


def test_torch_fused_attention_warns_it_has_no_kernels():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import numeric.torch as rt

    with pytest.warns(RuntimeWarning, match="normmax has no fused kernels"):
        q = torch.zeros(1, 1, 2, 4)
        rt.attention(q, q, q, mapping="normmax", backend="triton")
