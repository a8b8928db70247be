"""The mpmath reference: simplex, KKT, invariances, known values, Jacobian, losses."""

from __future__ import annotations

import math

import mpmath
import pytest
import sympy as sp
from hypothesis import assume, given
from hypothesis import strategies as st

from derive import reference as R
from derive.argmax import d, s, s_max, tau

from ._maps import ALL, BUILTINS, USERS, derivation, params

TIGHT = mpmath.mpf(10) ** -45
KKT = mpmath.mpf(10) ** -40

scores_moderate = st.lists(
    st.floats(min_value=-30, max_value=30, allow_nan=False, width=64), min_size=1, max_size=8
)
scores_wide = st.lists(
    st.one_of(
        st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
        st.floats(min_value=-1e-9, max_value=1e-9, allow_nan=False),
        st.integers(min_value=-3, max_value=3).map(float),  # ties
    ),
    min_size=1,
    max_size=8,
)
NAMES = BUILTINS + USERS


def _check_simplex_and_kkt(name, scores):
    dv = derivation(name)
    probs = dv.evaluate(scores, digits=50, **params(name))
    with mpmath.workdps(70):
        assert all(q >= 0 for q in probs)
        assert abs(mpmath.fsum(probs) - 1) < TIGHT
    assert R.kkt_residual(dv, scores, probs, digits=50, **params(name)) < KKT
    return probs


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_moderate)
def test_simplex_and_kkt(name, scores):
    _check_simplex_and_kkt(name, scores)


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_wide)
def test_simplex_and_kkt_wide_spreads_and_ties(name, scores):
    _check_simplex_and_kkt(name, scores)


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_moderate, data=st.data())
def test_permutation_equivariance(name, scores, data):
    perm = data.draw(st.permutations(range(len(scores))))
    dv = derivation(name)
    probs = dv.evaluate(scores, **params(name))
    permuted = dv.evaluate([scores[j] for j in perm], **params(name))
    with mpmath.workdps(70):
        assert max(abs(permuted[n] - probs[j]) for n, j in enumerate(perm)) < TIGHT


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_moderate, shift=st.floats(min_value=-1e3, max_value=1e3, allow_nan=False))
def test_shift_invariance(name, scores, shift):
    dv = derivation(name)
    probs = dv.evaluate(scores, **params(name))
    # add the shift exactly, in rational arithmetic
    shifted = [sp.Rational(v) + sp.Rational(shift) for v in scores]
    moved = dv.evaluate(shifted, **params(name))
    with mpmath.workdps(70):
        assert max(abs(a - b) for a, b in zip(probs, moved)) < KKT


@pytest.mark.parametrize(
    "name, expected, places",
    [
        ("softmax", [0.0486, 0.3592, 0.5922], 4),
        ("sparsemax", [0, 0.25, 0.75], 45),
        ("entmax15", [0, 0.3260, 0.6740], 4),
    ],
)
def test_known_values(name, expected, places):
    probs = derivation(name).evaluate([-2, 0, 0.5])
    with mpmath.workdps(60):
        for got, want in zip(probs, expected):
            assert abs(got - mpmath.mpf(sp.Rational(str(want)).p) / sp.Rational(str(want)).q) < 0.5 * mpmath.mpf(10) ** -places


def test_known_values_closed_forms():
    # softmax([-2, 0, 0.5]) and entmax15 from its quadratic, exactly
    probs = derivation("softmax").evaluate([-2, 0, 0.5])
    with mpmath.workdps(60):
        total = mpmath.exp(-2) + 1 + mpmath.exp(0.5)
        assert abs(probs[2] - mpmath.exp(0.5) / total) < TIGHT
        t = (mpmath.mpf("0.5") - mpmath.sqrt(mpmath.mpf("7.75"))) / 4  # 2t^2 - t/2 - 15/16 = 0
        got = derivation("entmax15").evaluate([-2, 0, 0.5])
        assert abs(got[1] - t**2) < TIGHT and abs(got[2] - (mpmath.mpf("0.25") - t) ** 2) < TIGHT


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_moderate, mask=st.lists(st.booleans(), min_size=8, max_size=8))
def test_masked_scores_are_dropped(name, scores, mask):
    keep = [m for m, _ in zip(mask, scores)]
    assume(any(keep))
    dv = derivation(name)
    masked = [v if m else -math.inf for v, m in zip(scores, keep)]
    full = dv.evaluate(masked, **params(name))
    dropped = iter(dv.evaluate([v for v, m in zip(scores, keep) if m], **params(name)))
    for q, m in zip(full, keep):
        if m:
            assert q == next(dropped)
        else:
            assert q == 0


@pytest.mark.parametrize("name", NAMES)
def test_all_masked_gives_zeros(name):
    assert derivation(name).evaluate([-math.inf] * 3, **params(name)) == [0, 0, 0]


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "tsallis2", "softmax"])
@given(scores=scores_wide)
def test_sort_and_closed_thresholds_agree_with_root_finding(name, scores):
    dv = derivation(name)
    assert dv.threshold.kind in ("sort", "closed")
    with mpmath.workdps(70):
        comp = R.compiled(dv, {})
        values = R.to_mp_vector(scores)
        assert abs(comp.tau(values) - comp._root_tau(values)) < KKT * max(1, max(abs(v) for v in values))


@given(scores=scores_moderate)
def test_general_alpha_matches_special_cases(scores):
    general = derivation("entmax_alpha")
    with mpmath.workdps(70):
        for alpha_value, name in ((sp.Rational(3, 2), "entmax15"), (2, "sparsemax")):
            got = general.evaluate(scores, alpha=alpha_value)
            want = derivation(name).evaluate(scores)
            assert max(abs(a - b) for a, b in zip(got, want)) < KKT


@given(scores=scores_moderate)
def test_alpha_to_one_approaches_softmax(scores):
    general, soft = derivation("entmax_alpha"), derivation("softmax")
    want = soft.evaluate(scores, digits=30)
    with mpmath.workdps(40):
        errors = [
            max(abs(a - b) for a, b in zip(general.evaluate(scores, digits=30, alpha=sp.Rational(1) + eps), want))
            for eps in (sp.Rational(1, 10**3), sp.Rational(1, 10**6))
        ]
    assert errors[1] <= 1e-4 and errors[1] <= errors[0] + mpmath.mpf(10) ** -25


@given(scores=scores_moderate)
def test_support_shrinks_as_alpha_grows(scores):
    general = derivation("entmax_alpha")
    sizes = [sum(1 for q in general.evaluate(scores, digits=30, alpha=a) if q > 0) for a in ("1.1", "1.5", "2", "3", "6")]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("name", NAMES)
@given(scores=st.lists(st.floats(min_value=-3, max_value=3, allow_nan=False), min_size=2, max_size=4))
def test_jacobian_matches_finite_differences(name, scores):
    """J = diag(w) - w w^T / sum(w) is the derivative of p*(s) wherever p* is smooth."""
    dv = derivation(name)
    par = params(name)
    jac = R.jacobian(dv, scores, digits=60, **par)
    center = dv.evaluate(scores, digits=60, **par)
    # p* is smooth away from support changes; near p_i -> 0 the weight of a sparse map
    # may blow up (w = 1/(6p) for p^3), so keep to points with a clear support
    assume(all(q == 0 or q > 1e-6 for q in center))
    with mpmath.workdps(80):
        h = mpmath.mpf(10) ** -20
        for col in range(len(scores)):
            up = [mpmath.mpf(v) + (h if n == col else 0) for n, v in enumerate(scores)]
            down = [mpmath.mpf(v) - (h if n == col else 0) for n, v in enumerate(scores)]
            pu = dv.evaluate(up, digits=60, **par)
            pd = dv.evaluate(down, digits=60, **par)
            if [q > 0 for q in pu] != [q > 0 for q in center] or [q > 0 for q in pd] != [q > 0 for q in center]:
                continue  # a kink of the support lies within h
            for row in range(len(scores)):
                fd = (pu[row] - pd[row]) / (2 * h)
                assert abs(fd - jac[row][col]) < mpmath.mpf(10) ** -25


@pytest.mark.parametrize("name", NAMES)
@given(
    scores=st.lists(st.floats(min_value=-3, max_value=3, allow_nan=False), min_size=3, max_size=3),
    target=st.lists(st.integers(min_value=0, max_value=5), min_size=3, max_size=3),
)
def test_fenchel_young_loss(name, scores, target):
    assume(sum(target) > 0)
    dv = derivation(name)
    par = params(name)
    y = [sp.Rational(t, sum(target)) for t in target]
    with mpmath.workdps(60):
        value = R.loss(dv, scores, y, digits=40, **par)
        assert value >= -mpmath.mpf(10) ** -35
        probs = dv.evaluate(scores, digits=40, **par)
        assert abs(R.loss(dv, scores, [str(q) for q in probs], digits=40, **par)) < mpmath.mpf(10) ** -30
        # the loss is C^1 with a Lipschitz gradient (p* has kinks), so a central
        # difference is accurate to O(h): take h tiny and the digits to afford it
        h = mpmath.mpf(10) ** -22
        for col in range(3):
            up = [mpmath.mpf(v) + (h if n == col else 0) for n, v in enumerate(scores)]
            down = [mpmath.mpf(v) - (h if n == col else 0) for n, v in enumerate(scores)]
            fd = (R.loss(dv, up, y, digits=50, **par) - R.loss(dv, down, y, digits=50, **par)) / (2 * h)
            assert abs(fd - (probs[col] - mpmath.mpf(y[col].p) / y[col].q)) < mpmath.mpf(10) ** -15


def test_softmax_loss_is_cross_entropy():
    dv = derivation("softmax")
    scores = [0.3, -1.2, 2.5, 0.0]
    with mpmath.workdps(60):
        lse = mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(v)) for v in scores))
        for label in range(4):
            onehot = [1 if n == label else 0 for n in range(4)]
            assert abs(R.loss(dv, scores, onehot) - (lse - mpmath.mpf(scores[label]))) < TIGHT


@pytest.mark.parametrize("name", [n for n in ALL if derivation(n).conjugate is not None])
@given(scores=st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False), min_size=1, max_size=4))
def test_symbolic_conjugate_matches_reference(name, scores):
    dv = derivation(name)
    par = params(name)
    numbers = {sp.Symbol(k, positive=True): sp.Rational(v) for k, v in par.items()}
    numbers = {q.symbol: sp.Rational(par[q.symbol.name]) for q in dv.parameters}
    t = R.threshold(dv, scores, digits=40, **par)
    expr = dv.conjugate.subs(numbers).subs(d, len(scores)).doit()
    expr = expr.subs({s[n + 1]: sp.Rational(v) for n, v in enumerate(scores)}).subs(tau, sp.Float(t, 45))
    want = R.conjugate(dv, scores, digits=40, **par)
    assert abs(sp.N(expr, 40) - sp.Float(want, 45)) < 1e-30


@pytest.mark.parametrize("name", NAMES)
@given(scores=scores_moderate)
def test_threshold_lies_in_bracket(name, scores):
    dv = derivation(name)
    par = params(name)
    numbers = {q.symbol: sp.Rational(par[q.symbol.name]) for q in dv.parameters}
    t = R.threshold(dv, scores, **par)
    at = {s_max: sp.Rational(max(scores)), d: len(scores), **numbers}
    lo, hi = (sp.N(b.subs(at), 60) for b in dv.threshold.bracket)
    assert lo - 1e-40 <= sp.Float(t, 60) <= hi + 1e-40


@pytest.mark.parametrize(
    "bad, message",
    [
        ([1.0, float("nan")], "finite numbers and -inf"),
        ([1.0, float("inf")], "finite numbers and -inf"),
        ([], "at least one"),
        ([[1.0, 2.0]], "1-D"),
        ("abc", "1-D sequence"),
    ],
)
def test_reference_rejects_bad_scores(bad, message):
    with pytest.raises(ValueError, match=message):
        derivation("softmax").evaluate(bad)


def test_reference_parameters_are_checked():
    dv = derivation("entmax_alpha")
    with pytest.raises(ValueError, match="needs values"):
        dv.evaluate([1, 2])
    with pytest.raises(ValueError, match="unknown parameter"):
        dv.evaluate([1, 2], alpha=1.5, beta=2)
    with pytest.raises(ValueError, match="outside"):
        dv.evaluate([1, 2], alpha=0.5)
    with pytest.raises(ValueError, match="digits"):
        dv.evaluate([1, 2], digits=2, alpha=1.5)
