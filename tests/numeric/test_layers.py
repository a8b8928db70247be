"""Layers: learned map parameters per head, score functions, dtype policy, state, repr.

Gradients are checked by central differences of the layer's own forward pass;
a learned alpha per head against attention computed head by head with that
alpha alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numeric as nm
from numeric import summaries as sm

from .conftest import importable_map
from .test_attention import _fd


def _check_grads(layer, x, dy, names, atol=1e-6, h=1e-6):
    layer.forward(x)
    layer.backward(dy)
    for name in names:
        orig = layer.params[name].copy()

        def f(a, name=name):
            layer.params[name] = a
            return float((layer.forward(x) * dy).sum())

        want = _fd(f, orig, h=h)
        layer.params[name] = orig
        np.testing.assert_allclose(layer.grads[name], want, atol=atol, err_msg=name)


def _entmax_layer(alpha=1.5, **kw):
    return nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax", alpha=alpha), dtype="float64", seed=1,
                                 learn=("alpha",), **kw)


@settings(max_examples=5)
@given(seed=st.integers(0, 2**16), causal=st.booleans(), logits=st.lists(st.floats(-2, 2), min_size=2, max_size=2))
def test_learned_alpha_per_head_gradient_by_finite_differences(seed, causal, logits):
    rng = np.random.default_rng(seed)
    layer = _entmax_layer(causal=causal)
    layer.params["alpha_logit"] = np.array(logits)
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    _check_grads(layer, x, dy, ["alpha_logit", "q_weight", "v_bias"])


def test_learned_alpha_starts_at_the_map_and_lies_in_its_range():
    layer = _entmax_layer()
    assert layer.params["alpha_logit"].shape == (2,)
    np.testing.assert_allclose(layer.map_params()["alpha"], [1.5, 1.5], rtol=1e-15)  # starts at the map's value
    layer.params["alpha_logit"] = np.array([-1.0, 2.0])
    # range (0, 3): the family's domain (0, inf) cut at twice the start's distance; the heads lie across 1
    alphas = 3 / (1 + np.exp(-layer.params["alpha_logit"]))
    assert alphas[0] < 1 < alphas[1]
    np.testing.assert_allclose(layer.map_params()["alpha"], alphas, rtol=1e-15)
    # (the layer is the map at those alphas head by head: tests/layers/test_properties.py, NumPy's and torch's)


def test_a_few_steps_on_alpha_lower_the_loss():
    """Gradient descent on the logits alone: the loss falls (the gradient points downhill)."""
    rng = np.random.default_rng(4)
    layer = _entmax_layer()
    x, target = rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 6, 8))
    losses = []
    for _ in range(20):
        y = layer.forward(x)
        losses.append(float(((y - target) ** 2).sum()))
        layer.backward(2 * (y - target))
        layer.params["alpha_logit"] = layer.params["alpha_logit"] - 0.5 * layer.grads["alpha_logit"]
    assert losses[-1] < losses[0]
    assert all(1 < a < 2 for a in layer.map_params()["alpha"])


def test_self_attention_learns_alpha():
    rng = np.random.default_rng(3)
    layer = nm.SelfAttention(4, mapping=nm.get_map("entmax", alpha=1.3), seed=0, learn=True, ranges={"alpha": (1.1, 3.0)})
    assert layer.params["alpha_logit"].shape == (1,)
    np.testing.assert_allclose(layer.map_params()["alpha"], [1.3], rtol=1e-14)
    _check_grads(layer, rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4)), ["alpha_logit", "K"])


def test_layers_with_a_score_function():
    rng = np.random.default_rng(5)
    add = sm.Additive(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3))
    layer = nm.MultiHeadAttention(8, 2, mapping="sparsemax", dtype="float64", seed=0, scores=add)
    assert {"scores_wq", "scores_wk", "scores_u"} <= set(layer.params)
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    y = layer.forward(x, need_weights=True)
    # the heads' weights are sparsemax of the additive scores of the projected heads
    q = (x @ layer.params["q_weight"].T + layer.params["q_bias"]).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)
    k = (x @ layer.params["k_weight"].T + layer.params["k_bias"]).reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(layer.attention_weights, nm.sparsemax(sm.additive_scores(q, k, *add.params.values())),
                               atol=1e-14)
    assert y.shape == x.shape
    _check_grads(layer, x, dy, ["scores_wq", "scores_u", "k_weight"])
    single = nm.SelfAttention(4, mapping="softmax", seed=0, scores=sm.Bilinear(rng.standard_normal((4, 4))))
    _check_grads(single, rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), ["scores_w", "Q"])


def test_state_dict_round_trip_through_a_file(tmp_path):
    rng = np.random.default_rng(6)
    layer = _entmax_layer(positional="learned", max_len=16)
    layer.params["alpha_logit"] = np.array([0.3, -0.7])
    x = rng.standard_normal((2, 5, 8))
    y = layer.forward(x)
    np.savez(tmp_path / "layer.npz", **layer.state_dict())
    other = nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax", alpha=1.2), dtype="float64", seed=9,
                                  learn=("alpha",), ranges=layer.ranges, positional="learned", max_len=16)
    assert not np.array_equal(other.forward(x), y)
    other.load_state_dict(np.load(tmp_path / "layer.npz"))
    np.testing.assert_array_equal(other.forward(x), y)
    state = layer.state_dict()
    state["q_weight"][:] = 0  # a copy: the layer is unchanged
    assert np.abs(layer.params["q_weight"]).max() > 0
    with pytest.raises(KeyError, match="missing \\['alpha_logit'\\]"):
        other.load_state_dict({k: v for k, v in state.items() if k != "alpha_logit"})
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict({**state, "q_bias": np.zeros(3)})
    other.load_state_dict({"q_bias": np.ones(8)}, strict=False)
    assert (other.params["q_bias"] == 1).all()
    f32 = nm.MultiHeadAttention(8, 2, seed=0)
    f32.load_state_dict(nm.MultiHeadAttention(8, 2, seed=3, dtype="float64").state_dict())
    assert all(p.dtype == np.float32 for p in f32.params.values())


def test_dtype_policy_is_shared():
    rng = np.random.default_rng(7)
    for make in (lambda dt: nm.MultiHeadAttention(4, 2, dtype=dt, seed=0), lambda dt: nm.SelfAttention(4, dtype=dt, seed=0)):
        half = make("float16")
        x = rng.standard_normal((2, 3, 4))
        assert half.forward(x.astype(np.float16)).dtype == np.float32  # float16 computes in float32
        half.backward(np.ones((2, 3, 4), np.float32))
        assert all(g.dtype == np.float16 for g in half.grads.values())  # gradients in the parameters' dtype
        single = make("float32")
        assert single.forward(x).dtype == np.float64  # float64 inputs are not rounded to float32
        single.backward(np.ones((2, 3, 4)))
        assert all(g.dtype == np.float32 for g in single.grads.values())
        assert single.forward(x.astype(np.float32)).dtype == np.float32


def test_repr_and_learn_errors():
    layer = _entmax_layer(causal=True)
    text = repr(layer)
    for part in ("MultiHeadAttention(", "embed_dim=8", "num_heads=2", "causal=True", "Map('entmax'", "learn=('alpha',)",
                 "(0.0, 3.0)", "dtype=float64"):
        assert part in text, (part, text)
    assert repr(nm.SelfAttention(4)).startswith("SelfAttention(dim=4, causal=False, mapping=Map('softmax'")
    with pytest.raises(ValueError, match="no parameter"):
        nm.MultiHeadAttention(8, 2, mapping="sparsemax", learn=("alpha",))
    with pytest.raises(ValueError, match="inside its domain"):
        nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax", alpha=1.5), learn=True, ranges={"alpha": (-0.5, 2)})
    with pytest.raises(ValueError, match="inside its domain"):
        nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax_sparse", alpha=1.5), learn=True, ranges={"alpha": (0.5, 2)})
    with pytest.raises(ValueError, match="inside the range"):
        nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax", alpha=2.5), learn=True, ranges={"alpha": (1, 2)})
    with pytest.raises(ValueError, match="not learned"):
        nm.MultiHeadAttention(8, 2, mapping=nm.get_map("entmax", alpha=1.5), ranges={"alpha": (1, 2)})


@pytest.fixture(scope="module")
def ccube(tmp_path_factory):
    """A typed map whose parameter is not alpha: ``p log p + c p**3``, c in (0, inf) (its link is a Lambert W)."""
    with importable_map(tmp_path_factory.mktemp("ccube_numpy"), "p*log(p) + c*p**3", "ccube", ("c in (0, oo)",)) as module:
        yield module


def test_any_parameter_learned_per_head_gradient_by_finite_differences(ccube):
    """learn=("c",) on a typed map: one logit per head in (0, 1) (the domain (0, inf) cut at 0 + 1), starting at the
    map's value, whose gradient is the finite differences' (as alpha's above)."""
    rng = np.random.default_rng(7)
    layer = nm.MultiHeadAttention(8, 2, mapping=nm.get_map(ccube, c=0.25), dtype="float64", seed=3, learn=("c",))
    assert layer.ranges == {"c": (0.0, 1.0)} and layer.params["c_logit"].shape == (2,)
    np.testing.assert_allclose(layer.map_params()["c"], [0.25, 0.25], rtol=1e-15)
    layer.params["c_logit"] = np.array([-0.7, 1.2])
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    _check_grads(layer, x, dy, ["c_logit", "k_weight"])


@pytest.mark.parametrize("causal", [False, True])
def test_layers_take_a_constraint_sets_keywords(causal):
    """The box's bounds pass through both layers to attention: the output is attention's over the box on the
    layer's projections, and the gradients (of the parameters and of the input) are those of the bounded forward
    pass, by central differences."""
    rng = np.random.default_rng(7)
    layer = nm.MultiHeadAttention(8, 2, mapping="sparsemax", dtype="float64", seed=3, causal=causal)
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    upper = rng.uniform(0.3, 0.9, size=(2, 1, 5, 5))
    upper[..., range(5), range(5)] = 1.0  # (feasible for every query, causal too)
    y = layer.forward(x, upper=upper)
    q, k, v = (layer._split(layer._project(x, name, np)) for name in ("q", "k", "v"))
    heads = nm.attention(q, k, v, mapping="sparsemax", causal=causal, upper=upper)
    np.testing.assert_allclose(y, layer._project(layer._merge(heads), "out", np), rtol=0, atol=1e-13)
    assert not np.allclose(y, layer.forward(x))  # (the bounds bind)
    layer.forward(x, upper=upper)
    dx = layer.backward(dy)
    want = _fd(lambda a: float((layer.forward(a, upper=upper) * dy).sum()), x, h=1e-6)
    np.testing.assert_allclose(dx, want, atol=1e-6)
    single = nm.SelfAttention(8, mapping="entmax15", causal=causal, seed=2)
    bound = rng.uniform(0.3, 0.9, size=(5, 5)) + np.eye(5)
    single.forward(x, upper=bound)
    dx = single.backward(dy)
    want = _fd(lambda a: float((single.forward(a, upper=bound) * dy).sum()), x, h=1e-6)
    np.testing.assert_allclose(dx, want, atol=1e-6)


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_a_learned_sink_per_head(mapping):
    """learn=("sink",): the parameter "sink" (H,), starting at 0; the layer equals the same layer given the sink as a
    keyword; its gradient (and the others') are central differences; the single-head layer refuses it."""
    layer = nm.MultiHeadAttention(8, 2, mapping=mapping, dtype="float64", seed=1, learn=("sink",), causal=True)
    assert np.array_equal(layer.params["sink"], np.zeros(2))
    layer.params["sink"] = np.array([0.3, -0.8])
    plain = nm.MultiHeadAttention(8, 2, mapping=mapping, dtype="float64", seed=1, causal=True)
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    np.testing.assert_allclose(layer.forward(x), plain.forward(x, sink=np.array([0.3, -0.8])), rtol=1e-14, atol=1e-15)
    _check_grads(layer, x, dy, ["sink", "q_weight", "out_bias"])
    with pytest.raises(ValueError, match="learns its sinks"):
        layer.forward(x, sink=0.0)
    with pytest.raises(ValueError, match="MultiHeadAttention's"):
        nm.SelfAttention(4, learn=("sink",))
