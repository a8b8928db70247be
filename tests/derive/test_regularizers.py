"""Regularizer construction, built-ins, safe parsing and bad input."""

from __future__ import annotations

import builtins

import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

import derive
from derive import DerivationError, Parameter, Regularizer, alpha, gini, p, shannon, tsallis


def test_builtin_forms():
    assert shannon().omega == p * sp.log(p)
    assert sp.simplify(gini().omega - p**2 / 2) == 0
    a = sp.Rational(3, 2)
    assert sp.simplify(tsallis(a).omega - (p**a - p) / (a * (a - 1))) == 0
    assert tsallis(1.5).omega == tsallis(sp.Rational(3, 2)).omega
    assert tsallis("3/2").omega == tsallis(a).omega


def test_tsallis_alpha_to_one_is_shannon():
    # the limit of the regularizer itself ...
    assert sp.simplify(sp.limit(tsallis().omega, alpha, 1) - p * sp.log(p)) == 0
    # ... and of its link, which becomes softmax's exp(z - 1)
    from derive import derive_map, z

    link = derive_map(tsallis()).link
    assert sp.simplify(sp.limit(link, alpha, 1) - sp.exp(z - 1)) == 0


def test_tsallis_symbolic_alpha_has_a_domain():
    reg = tsallis()
    (param,) = reg.parameters
    assert param.symbol == alpha and param.lower == 1 and param.upper == sp.oo
    assert tsallis(lower=0, upper=1).parameters[0].upper == 1
    spanning = tsallis(lower=sp.Rational(1, 2), upper=2).parameters[0]  # (a family: derive.family splits it at 1)
    assert (spanning.lower, spanning.upper) == (sp.Rational(1, 2), 2)
    with pytest.raises(DerivationError, match="domain"):
        tsallis(lower=-1, upper=2)


@pytest.mark.parametrize("bad", [1, 0, -1, "one", True, sp.I])
def test_tsallis_rejects_bad_alpha(bad):
    with pytest.raises(DerivationError, match="alpha"):
        tsallis(bad)


def test_from_string_matches_expressions():
    reg = Regularizer.from_string("p*log(p) + p**2/2", name="mixed")
    assert reg.omega == p * sp.log(p) + p**2 / 2
    assert reg.name == "mixed"
    assert Regularizer.from_string("p^2/2").omega == p**2 / 2
    assert Regularizer.from_string("0.5*p**2").omega == p**2 / 2  # exact decimal
    assert Regularizer.from_string("exp(p) + sqrt(p)**3").omega == sp.exp(p) + p ** sp.Rational(3, 2)
    assert Regularizer.from_string(reg.text).omega == reg.omega


def test_plain_symbol_p_is_accepted():
    q = sp.Symbol("p")
    assert Regularizer(q**2).omega == p**2


def test_parameters_from_string():
    beta = sp.Symbol("beta", positive=True)
    reg = Regularizer.from_string("p**2 + beta*p*log(p)", parameters=(Parameter(beta, 0, 10),))
    assert reg.omega == p**2 + beta * p * sp.log(p)


@pytest.mark.parametrize(
    "text, message",
    [
        ("__import__('os').system('true')", "not allowed"),
        ("p.__class__", "Attribute is not allowed"),
        ("(lambda: 1)()", "not allowed"),
        ("[p][0]", "not allowed"),
        ("log(p, 2)", "exactly one argument"),
        ("log(x=p)", "keyword"),
        ("open", "unknown name"),
        ("q*p", "unknown name 'q'"),
        ("'p'", "only real numbers"),
        ("p if p else 1", "not allowed"),
        ("p < 1", "not allowed"),
        ("1j*p", "only real numbers"),
        ("p**2 +", "cannot parse"),
        ("", "empty"),
        ("p" + "+p" * 1500, "characters long"),
        ("log", "must be called"),
        ("abs(p)", "'abs' is not allowed"),
        ("p/0", "division by zero"),
        ("p**(10**9)", "too large"),
        ("10**10**10", "too large"),
    ],
)
def test_from_string_rejects(text, message):
    with pytest.raises(DerivationError, match=message):
        Regularizer.from_string(text)


def test_from_string_never_evaluates(monkeypatch):
    """Parsing uses neither eval/exec nor SymPy's string parsers."""

    def forbidden(*args, **kwargs):
        raise AssertionError("user text reached an evaluator")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(sp, "parse_expr", forbidden)
    monkeypatch.setattr(sp.parsing.sympy_parser, "parse_expr", forbidden)
    monkeypatch.setattr(sp.core.sympify, "_sympify", forbidden, raising=False)
    assert Regularizer.from_string("p*log(p) + p**2/2").omega == p * sp.log(p) + p**2 / 2


@given(st.text(st.characters(min_codepoint=1, max_codepoint=0x2FFF, exclude_categories=("Cs",)), max_size=40))
def test_arbitrary_text_is_accepted_or_rejected_cleanly(text):
    try:
        Regularizer.from_string(text)
    except DerivationError:
        pass


@given(
    st.lists(st.sampled_from(["p", "2", "3", "log(p)", "exp(p)", "sqrt(p)", "1/2", "(p+1)"]), min_size=1, max_size=4),
    st.lists(st.sampled_from(["+", "*", "-", "/", "**"]), min_size=3, max_size=3),
)
def test_composed_text_is_accepted_or_rejected_cleanly(atoms, ops):
    text = atoms[0] + "".join(op + atom for op, atom in zip(ops, atoms[1:]))
    try:
        reg = Regularizer.from_string(text)
    except DerivationError as exc:
        assert str(exc)
    else:
        assert reg.omega.has(p)


@pytest.mark.parametrize(
    "omega, message",
    [
        (p, "not strictly convex"),
        (-(p**2), "not strictly convex"),
        (p**3 - p**2, "not strictly convex"),
        (sp.log(p), "not strictly convex"),
        (p * sp.log(p) - p**2, "not strictly convex"),
        (sp.sin(8 * p), "not strictly convex"),
        (p**2 + sp.Symbol("q") * p, "free symbol"),
        (sp.Abs(p - sp.Rational(1, 2)) + p**2, "not differentiable"),
        (sp.Max(p, sp.Rational(1, 2)) ** 2, "not differentiable"),
        (sp.Piecewise((p**2, p < sp.Rational(1, 2)), (p, True)), "not differentiable"),
        (sp.gamma(p), "not supported"),
        (sp.sqrt(p - sp.Rational(1, 2)) + p**2, "not real"),
        (sp.Integer(3), "does not depend on p"),
        (1 / (p - sp.Rational(1, 3)) ** 2, "omega"),
    ],
)
def test_bad_regularizers(omega, message):
    with pytest.raises(DerivationError, match=message):
        Regularizer(omega)


def test_bad_regularizer_is_a_value_error():
    with pytest.raises(ValueError):
        Regularizer(p)
    with pytest.raises(DerivationError, match="from_string"):
        Regularizer("p**2")


def test_convexity_is_proved_or_checked():
    assert "proved" in gini().convexity
    assert "proved" in shannon().convexity
    assert "proved" in Regularizer(p**2 / 2 + p**4 / 4).convexity
    mixed = Regularizer(p * sp.log(p) + sp.cos(p))  # omega'' = 1/p - cos(p) > 0 on (0, 1]
    assert mixed.convexity


def test_public_names():
    for name in ("p", "z", "Regularizer", "shannon", "gini", "tsallis", "derive_map", "DerivationError"):
        assert hasattr(derive, name)
