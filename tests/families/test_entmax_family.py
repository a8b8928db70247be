"""alpha-entmax for every alpha > 0: the family ``entmax`` (:mod:`derive.family`, :mod:`numeric.family`).

Dense below 1, softmax at 1, sparse above; NumPy checked against the 50-digit reference of each case's derivation
(:mod:`derive.reference`), the KKT conditions, finite differences for the gradients in alpha (through 1, where
the point case's first-order terms carry it), and a user's family with no closed-form link of its own kind.
torch and JAX against NumPy, each property written once (:mod:`tests.backends`): values per row across 1 (eager
and jit), gradients in the scores and in alpha against finite differences and NumPy's VJP, the loss's, attention
with one alpha per head; torch's learned alpha crossing 1 and torch.compile stay torch's.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from derive import DerivationError, alpha, derive_map, p, tsallis
from derive import reference
from derive.family import derive_family, split_points
from numeric import family
from tests.backends import backend_params
from tests.numeric.conftest import importable_map

ENTMAX = nm.get_map("entmax", alpha=1.5).module


@pytest.fixture(scope="module")
def cases():
    """The derivations of the three cases, (0, 1), alpha = 1, (1, oo)."""
    return [derive_map(c.regularizer) for c in derive_family(tsallis(lower=0)).cases]


def want(cases, x, a, digits=50):
    """The reference of the case holding ``a``."""
    dv = cases[0] if a < 1 else cases[1] if a == 1 else cases[2]
    params = {} if a == 1 else {"alpha": mpmath.mpf(a)}
    return np.array([float(v) for v in reference.evaluate(dv, list(map(float, x)), digits=digits, **params)])


# ------------------------------------------------------------------ derive
def test_the_family_splits_at_one_and_names_its_cases():
    reg = tsallis(lower=0)
    assert split_points(reg.omega, reg.parameters[0]) == (1,)
    fam = derive_family(reg)
    assert fam.describe() == "(0, 1), alpha = 1, (1, oo)"
    kinds = [derive_map(c.regularizer) for c in fam.cases]
    assert [d.sparse for d in kinds] == [False, False, True]
    assert sp.simplify(fam.cases[1].regularizer.omega - p * sp.log(p)) == 0
    with pytest.raises(DerivationError, match=r"cases are \(0, 1\), alpha = 1, \(1, oo\)"):
        derive_map(reg)
    # a domain inside one case is one map; one holding no split point is not a family
    assert derive_map(tsallis(lower=0, upper=1)).sparse is False
    with pytest.raises(DerivationError, match="one map"):
        derive_family(tsallis())


def test_the_point_limits_are_the_derivatives_in_alpha():
    """lim d omega'/d alpha and d omega/d alpha at 1 against central differences of the formula at 60 digits."""
    fam = derive_family(tsallis(lower=0))
    d_prime, d_omega = fam.derivatives[1]
    omega = (p**alpha - p) / (alpha * (alpha - 1))
    f0 = sp.lambdify((p, alpha), omega, "mpmath")
    f1 = sp.lambdify((p, alpha), sp.diff(omega, p), "mpmath")
    with mpmath.workdps(60):
        h = mpmath.mpf("1e-15")
        for v in ("1e-6", "0.03", "0.5", "1"):
            v = mpmath.mpf(v)
            # the derivative at 1 as the limit of the derivative at 1 +- h (0/0 at 1 itself)
            fd1 = (f1(v, 1 + 2 * h) - f1(v, 1 + h)) / h / 2 + (f1(v, 1 - h) - f1(v, 1 - 2 * h)) / h / 2
            fd0 = (f0(v, 1 + 2 * h) - f0(v, 1 + h)) / h / 2 + (f0(v, 1 - h) - f0(v, 1 - 2 * h)) / h / 2
            assert abs(fd1 - d_prime.subs(p, v).evalf(50)) < 1e-12
            assert abs(fd0 - d_omega.subs(p, v).evalf(50)) < 1e-12
            assert float(ENTMAX.omega_prime_d_alpha_case1(float(v))) == pytest.approx(float(fd1), rel=1e-13, abs=1e-14)


# ------------------------------------------------------------------ values
@settings(max_examples=25, deadline=None)
@given(x=st.lists(st.floats(-30, 30), min_size=1, max_size=10),
       a=st.sampled_from([0.05, 0.4, 0.9, 1 - 1e-7, 1.0, 1 + 1e-7, 1.2, 2.0, 4.5]))
def test_matches_the_reference_of_its_case(cases, x, a):
    x = np.array(x)
    got = nm.entmax(x, alpha=a)
    np.testing.assert_allclose(got, want(cases, x, a), rtol=0, atol=1e-13)
    assert got.sum() == pytest.approx(1, abs=1e-14)
    if a <= 1:
        assert (got > 0).all()  # dense up to 1 (heavy tails below)


def test_continuous_through_one(cases):
    x = np.array([-3.0, -0.5, 0.0, 0.4, 2.0])
    at_one = nm.softmax(x)
    for h in (1e-3, 1e-6, 1e-9, 1e-12):
        for a in (1 - h, 1 + h):
            assert np.abs(nm.entmax(x, alpha=a) - at_one).max() < 4 * h
    np.testing.assert_allclose(nm.entmax(x, alpha=1.0), at_one, rtol=1e-15, atol=0)


def test_one_value_per_row_across_cases_is_each_value_alone():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 9)) * 3
    a = np.array([0.3, 0.99, 1.0, 1.0 + 1e-9, 1.5, 3.0])[:, None]
    m = nm.get_map("entmax", alpha=a)
    rows = np.stack([nm.entmax(x[i], alpha=float(a[i, 0])) for i in range(6)])
    np.testing.assert_array_equal(m(x), rows)
    assert m.sparse is None and nm.get_map("entmax", alpha=0.5).sparse is False and nm.get_map("entmax", alpha=2.0).sparse


def _fd_alpha(x, a, dy, h=1e-6):
    """d <dy, p> / d alpha by central differences of the 50-digit reference."""
    dvs = [derive_map(c.regularizer) for c in derive_family(tsallis(lower=0)).cases]
    at = lambda v: want(dvs, x, v)  # noqa: E731
    if a == 1:  # from either side, each a one-sided second-order difference, averaged
        up = (-3 * at(1.0) + 4 * at(1 + h) - at(1 + 2 * h)) / (2 * h)
        down = (3 * at(1.0) - 4 * at(1 - h) + at(1 - 2 * h)) / (2 * h)
        return float(dy @ up), float(dy @ down)
    g = float(dy @ ((at(a + h) - at(a - h)) / (2 * h)))
    return g, g


@pytest.mark.parametrize("a", [0.6, 1.0, 1.3])
def test_gradient_in_alpha_matches_finite_differences_through_one(a):
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])
    m = nm.get_map("entmax", alpha=a)
    g = m.vjp_params(m(x), dy)["alpha"]
    up, down = _fd_alpha(x, a, dy)
    assert float(g) == pytest.approx(up, abs=1e-7)
    assert float(g) == pytest.approx(down, abs=1e-7)


def test_gradient_in_alpha_is_continuous_through_one():
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])
    g = lambda a: float(nm.get_map("entmax", alpha=a).vjp_params(nm.entmax(x, alpha=a), dy)["alpha"])  # noqa: E731
    at_one = g(1.0)
    for h in (1e-4, 1e-6, 1e-8):
        assert abs(g(1 - h) - at_one) < 10 * h and abs(g(1 + h) - at_one) < 10 * h


def test_the_loss_and_its_parameter_gradient_through_one(cases):
    x = np.array([[-1.0, 0.0, 0.3, 0.8, 1.5]])
    y = np.array([[0.1, 0.2, 0.0, 0.3, 0.4]])
    values = {a: nm.get_map("entmax", alpha=a).loss(x, y) for a in (1 - 1e-7, 1.0, 1 + 1e-7)}
    assert values[1.0] == pytest.approx(nm.get_map("softmax").loss(x, y), rel=1e-14)
    assert abs(values[1 - 1e-7] - values[1.0]) < 1e-6 and abs(values[1 + 1e-7] - values[1.0]) < 1e-6


# ------------------------------------------------------------------ errors
def test_refusals():
    with pytest.raises(ValueError, match=r"outside \(0.0, inf\)"):
        nm.entmax(np.zeros(3), alpha=0.0)
    with pytest.raises(ValueError, match="sort"):
        nm.get_map("entmax", alpha=1.5, threshold="sort")
    with pytest.raises(DerivationError, match="inside"):
        tsallis(lower=-1)


# --------------------------------------------------------- a user's family
TYPED = "(p**a - p)/(a*(a-1)) + p**3/3"


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    with importable_map(tmp_path_factory.mktemp("typed_family"), TYPED, "tsallis_cubed", ("a in (0, oo)",)) as module:
        yield module


def test_a_user_family_is_generated_case_by_case(typed):
    assert family.is_family(typed)
    assert [name for _, _, name in typed.CASES] == ["tsallis_cubed_case0", "tsallis_cubed_case1", "tsallis_cubed_case2"]
    assert [m.SPARSE for m in family.case_modules(typed)] == [False, False, True]


@pytest.mark.parametrize("a", [0.5, 1.0, 1.7])
def test_a_user_family_meets_its_kkt_conditions(typed, a):
    """omega'(p_i) = s_i - tau on the support, omega' at 60 digits (at 1: the limit p log p + p**3/3)."""
    x = np.array([-4.0, -1.0, 0.0, 0.6, 2.0])
    got = nm.get_map(typed, a=a)(x)
    q = sp.Symbol("a", positive=True)
    omega = (p**q - p) / (q * (q - 1)) + p**3 / 3
    d1 = sp.diff(omega if a != 1 else sp.limit(omega, q, 1), p)
    f1 = sp.lambdify((p, q), d1, "mpmath")
    with mpmath.workdps(60):
        gaps = [f1(mpmath.mpf(float(v)), mpmath.mpf(a)) - mpmath.mpf(float(s)) for v, s in zip(got, x) if v > 0]
    assert sum(got) == pytest.approx(1, abs=1e-14)
    assert float(max(gaps) - min(gaps)) < 1e-10 * max(1, float(max(abs(g) for g in gaps)))


def test_a_user_family_gradient_in_its_parameter_is_continuous(typed):
    x = np.array([-1.0, 0.0, 0.3, 0.8, 1.5])
    dy = np.array([0.3, -1.0, 0.5, 0.2, 1.0])

    def g(a):
        m = nm.get_map(typed, a=a)
        return float(m.vjp_params(m(x), dy)["a"])

    at_one = g(1.0)
    fd = (nm.get_map(typed, a=1 + 1e-6)(x) - nm.get_map(typed, a=1 - 1e-6)(x)) @ dy / 2e-6
    assert at_one == pytest.approx(float(fd), abs=1e-7)
    assert abs(g(1 + 1e-7) - at_one) < 1e-6 and abs(g(1 - 1e-7) - at_one) < 1e-6


def test_the_entmax_package_agrees_below_and_above_one():
    entmax = pytest.importorskip("entmax")
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).normal(size=(4, 7)) * 2
    for a in (0.5, 1.5, 2.5):
        theirs = entmax.entmax_bisect(torch.tensor(x), alpha=a, n_iter=200).numpy()
        np.testing.assert_allclose(nm.entmax(x, alpha=a), theirs, atol=1e-12)
    assert not math.isnan(nm.entmax(x, alpha=1e-3).sum())


# ------------------------------------------------------------------ every backend against NumPy
AUTODIFF = backend_params("autodiff")
ACROSS = np.array([0.4, 0.9, 1.0, 1.0 + 1e-6, 1.3, 2.5])[:, None]


def _x(seed=0, n=7):
    return np.random.default_rng(seed).normal(size=(len(ACROSS), n)) * 3


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_values_per_row_across_one_equal_numpy(backend):
    """One alpha per row, on both sides of 1 and at 1 (the family's routines; under jit too), and each alpha as
    a number (the case's own rules)."""
    x = _x()
    want = nm.get_map("entmax", alpha=ACROSS)(x)
    m = backend.get_map("entmax")
    np.testing.assert_allclose(backend.numpy(backend.call(m, backend.array(x), alpha=backend.array(ACROSS))), want,
                               rtol=0, atol=1e-15)
    if "jit" in backend.features:
        got = backend.jit(lambda s, a: backend.call(m, s, alpha=a))(backend.array(x), backend.array(ACROSS))
        np.testing.assert_allclose(backend.numpy(got), want, rtol=0, atol=1e-15)
    for i, a in enumerate(ACROSS[:, 0]):
        np.testing.assert_allclose(backend.numpy(backend.call(m, backend.array(x[i]), alpha=float(a))), want[i],
                                   rtol=0, atol=1e-15)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradients_in_the_scores_and_alpha_across_one(backend):
    """Against finite differences (in both at once), and in alpha against NumPy's VJP: within 1e-6 of 1 the printed
    d omega'/d alpha of the sparse case is a difference that cancels (its terms ~ 1/(alpha - 1)**2 apart from the
    sum), where the backends' roundings and NumPy's differ by 1e-11 relative."""
    x = _x(1, 5)
    m = backend.get_map("entmax")
    backend.check_grads(lambda s, a: backend.call(m, s, alpha=a), backend.array(x), backend.array(ACROSS), order=1,
                        atol=1e-7)
    dy = np.random.default_rng(1).normal(size=x.shape)
    ref = nm.get_map("entmax", alpha=ACROSS)
    want = ref.vjp_params(ref(x), dy)["alpha"]
    got = backend.grad(lambda a: (backend.call(m, backend.array(x), alpha=a) * backend.array(dy)).sum(),
                       backend.array(ACROSS))[:, 0]
    near = np.abs(ACROSS[:, 0] - 1) < 1e-4
    np.testing.assert_allclose(got[~near], want[~near], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[near], want[near], rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_the_loss_and_its_gradients_across_one(backend):
    """The loss per row equals NumPy's; its gradients in the scores and alpha against finite differences, and in
    alpha against central differences of NumPy's loss."""
    x = _x(2, 5)
    labels = np.array([0, 1, 2, 3, 4, 0])
    lab = backend.array(labels)

    def loss(s, a, reduction="none"):
        return backend.loss(backend.get_map("entmax", alpha=a), s, lab, reduction=reduction)

    want = nm.get_map("entmax", alpha=ACROSS).loss(x, labels, reduction="none")
    np.testing.assert_allclose(backend.numpy(loss(backend.array(x), backend.array(ACROSS))), want, rtol=1e-13,
                               atol=1e-15)
    backend.check_grads(loss, backend.array(x), backend.array(ACROSS), order=1, atol=1e-7)
    got = backend.grad(lambda a: loss(backend.array(x), a, "sum"), backend.array(ACROSS))[:, 0]
    h = 1e-6
    for i in range(len(ACROSS)):
        up, down = ACROSS.copy(), ACROSS.copy()
        up[i] += h
        down[i] -= h
        fd = (nm.get_map("entmax", alpha=up).loss(x, labels, reduction="sum")
              - nm.get_map("entmax", alpha=down).loss(x, labels, reduction="sum")) / (2 * h)
        assert got[i] == pytest.approx(fd, abs=1e-7)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_attention_with_one_alpha_per_head_across_one(backend):
    rng = np.random.default_rng(3)
    q, k, v = (backend.array(rng.normal(size=(2, 3, 6, 4))) for _ in range(3))
    a = np.array([0.6, 1.0, 1.8]).reshape(3, 1, 1)
    out = backend.numpy(backend.attention(q, k, v, backend.get_map("entmax", alpha=backend.array(a)), is_causal=True))
    for h in range(3):
        one = backend.attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1],
                                backend.get_map("entmax", alpha=float(a[h, 0, 0])), is_causal=True)
        np.testing.assert_allclose(out[:, h:h + 1], backend.numpy(one), rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_a_negative_alpha_is_refused_and_a_tiny_one_is_finite(backend):
    m = backend.get_map("entmax")
    with pytest.raises(ValueError, match="outside"):
        backend.call(m, backend.array(np.zeros(3)), alpha=-0.5)
    x = np.random.default_rng(0).normal(size=(3, 40))
    assert np.isfinite(backend.numpy(backend.call(m, backend.array(x), alpha=0.01))).all()


def test_torch_a_learned_alpha_crosses_one():
    """The family's range from 1.5 is (0, 3): logits put the heads below, at and above 1; the layer's weights are
    the map's with those alphas, and its gradient in the logits passes gradcheck."""
    torch = pytest.importorskip("torch")
    import numeric.torch as rt
    from numeric.torch.layers import MultiheadAttention

    f64 = torch.float64
    torch.manual_seed(4)
    layer = MultiheadAttention(6, 3, dtype=f64, mapping=rt.get_map("entmax", alpha=1.5), learn=("alpha",),
                               batch_first=True)
    assert layer.ranges == {"alpha": (0.0, 3.0)}
    logits = torch.tensor([-1.0, 0.0, 1.0], dtype=f64)  # alpha = 3 sigmoid(logit): 0.807, 1.5, 2.19
    with torch.no_grad():
        layer.alpha_logit.copy_(torch.log(torch.tensor([1 / 2, 1.0, 2.0], dtype=f64)))  # alpha = 1, 1.5, 2
    torch.testing.assert_close(layer.learned["alpha"].detach(), torch.tensor([1.0, 1.5, 2.0], dtype=f64))
    x = torch.randn(2, 4, 6, dtype=f64)
    params = dict(layer.named_parameters())

    def f(x, logit):
        out, w = torch.func.functional_call(layer, {**params, "alpha_logit": logit}, (x, x, x),
                                            dict(need_weights=True, average_attn_weights=False))
        return out, w

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), logits.clone().requires_grad_()))
    # a step that takes a head across 1 leaves everything finite
    out, _ = f(x, torch.tensor([-8.0, 0.0, 8.0], dtype=f64))
    assert torch.isfinite(out).all()


def test_torch_under_compile_with_alpha_across_one():
    """Traced alpha (values the trace cannot read) runs the family's routines."""
    torch = pytest.importorskip("torch")
    import numeric.torch as rt

    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    a = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)[:, None]
    compiled = torch.compile(lambda s, al: rt.entmax(s, al), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, a), rt.entmax(x, a), rtol=0, atol=1e-15)
