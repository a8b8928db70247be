"""numeric.torch.MultiheadAttention learning any parameter of a map, one value per head (``learn=``), and a map
parameter bound to an nn.Parameter belonging to the layer.

The map is a typed one with a parameter that is not alpha: ``p log p + c p**3``, c in (0, inf) (its link is a
Lambert W), generated as ``regattn generate --expr`` writes it.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from numeric.torch.layers import MultiheadAttention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402
from tests.numeric.conftest import importable_map  # noqa: E402

F64 = torch.float64
E, H = 6, 3


@pytest.fixture(scope="module")
def ccube(tmp_path_factory):
    """The generated module of ``p*log(p) + c*p**3``, c in (0, oo)."""
    with importable_map(tmp_path_factory.mktemp("ccube"), "p*log(p) + c*p**3", "ccube", ("c in (0, oo)",)) as module:
        yield module


def test_a_learned_parameter_is_a_parameter_per_head_in_its_domain(ccube):
    torch.manual_seed(0)
    layer = MultiheadAttention(E, H, dtype=F64, mapping=get_map(ccube, c=0.25), learn=("c",))
    assert dict(layer.named_parameters())["c_logit"].shape == (H,)
    assert "c_logit" in layer.state_dict() and layer.alpha_logit is None and layer.alpha is None
    # the domain (0, inf) cut at 0 + 1; the start is the map's value
    assert layer.ranges == {"c": (0.0, 1.0)}
    torch.testing.assert_close(layer.learned["c"].detach(), torch.full((H,), 0.25, dtype=F64), rtol=0, atol=1e-15)
    with torch.no_grad():
        layer.c_logit.copy_(torch.tensor([-50.0, 0.0, 50.0]))
    c = layer.learned["c"].detach()
    assert bool(((0 < c) & (c < 1)).all())  # a logit far out still gives a value inside the domain
    assert "learn=('c',)" in repr(layer)


def test_a_learned_parameter_is_the_map_with_those_values_head_by_head(ccube):
    torch.manual_seed(1)
    layer = MultiheadAttention(E, H, dtype=F64, mapping=get_map(ccube, c=0.5), learn=("c",), ranges={"c": (0.1, 3.0)})
    with torch.no_grad():
        layer.c_logit.copy_(torch.tensor([-1.0, 0.5, 2.0]))
    want_c = 0.1 + 2.9 / (1 + torch.exp(-torch.tensor([-1.0, 0.5, 2.0], dtype=F64)))
    torch.testing.assert_close(layer.learned["c"].detach(), want_c, rtol=1e-15, atol=0)
    x = torch.randn(4, 2, E, dtype=F64)
    for h in range(H):  # head h of the layer is head h of a layer whose map has c = want_c[h] for every head
        fixed = MultiheadAttention(E, H, dtype=F64, mapping=get_map(ccube, c=float(want_c[h])))
        fixed.load_state_dict(layer.state_dict(), strict=False)
        _, w = layer(x, x, x, need_weights=True, average_attn_weights=False)
        _, w_fixed = fixed(x, x, x, need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(w[:, h], w_fixed[:, h], rtol=0, atol=1e-13)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_of_a_learned_parameter(ccube, need_weights):
    torch.manual_seed(2)
    layer = MultiheadAttention(E, H, dtype=F64, mapping=get_map(ccube, c=0.5), learn=True, batch_first=True)
    params = dict(layer.named_parameters())
    names = ["c_logit", "in_proj_weight"]
    x = torch.randn(2, 4, E, dtype=F64, requires_grad=True)

    def f(x, *values):
        state = {**params, **dict(zip(names, values))}
        out, w = torch.func.functional_call(layer, state, (x, x, x), dict(need_weights=need_weights))
        return out if w is None else (out, w)

    values = [torch.tensor([-0.5, 0.2, 1.0], dtype=F64, requires_grad=True), params["in_proj_weight"].detach().clone()
              .requires_grad_()]
    assert torch.autograd.gradcheck(f, (x, *values))


def test_learn_alpha_is_shorthand_for_learn_alpha(ccube):
    torch.manual_seed(3)
    a = MultiheadAttention(E, H, mapping="entmax", learn_alpha=True, alpha_range=(1.1, 1.9))
    torch.manual_seed(3)
    b = MultiheadAttention(E, H, mapping="entmax", learn=("alpha",), ranges={"alpha": (1.1, 1.9)})
    assert a.learn == b.learn == ("alpha",) and a.ranges == b.ranges and a.alpha_range == (1.1, 1.9)
    assert a.state_dict().keys() == b.state_dict().keys()
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(a(x, x, x)[0], b(x, x, x)[0], rtol=0, atol=0)


def test_a_bound_nn_parameter_is_the_layers(ccube):
    torch.manual_seed(4)
    c = torch.nn.Parameter(torch.tensor(0.7, dtype=F64))
    layer = MultiheadAttention(E, H, dtype=F64, mapping=get_map(ccube, c=c))
    assert dict(layer.named_parameters())["map_c"] is c
    assert torch.equal(layer.state_dict()["map_c"], c.detach())
    x = torch.randn(3, 2, E, dtype=F64)
    out, _ = layer(x, x, x)
    out.square().sum().backward()
    assert c.grad is not None and float(c.grad) != 0
    # saved and loaded with the layer
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["map_c"] = torch.tensor(0.3, dtype=F64)
    layer.load_state_dict(state)
    assert float(c.detach()) == 0.3


@pytest.mark.parametrize("kw, match", [
    (dict(learn=("b",)), r"has no parameter\(s\) \['b'\] to learn"),
    (dict(learn=("c",), ranges={"c": (-1.0, 1.0)}), r"range \(-1.0, 1.0\) of c must be finite, with lo < hi, and inside"),
    (dict(learn=("c",), ranges={"c": (0.0, math.inf)}), "must be finite"),
    (dict(learn=("c",), ranges={"c": (0.6, 0.9)}), r"map parameter c = 0.5 must be one number inside the range"),
    (dict(ranges={"c": (0.1, 0.9)}), "not learned"),
])
def test_learn_errors(ccube, kw, match):
    with pytest.raises(ValueError, match=match):
        MultiheadAttention(E, H, mapping=get_map(ccube, c=0.5), **kw)


def test_a_learned_sink_per_head():
    """learn=("sink",): the layer equals the same layer given the sink as a keyword (one value per head and query,
    nn.MultiheadAttention's (N * num_heads, L, 1) layout), with weights and without; the sink's gradient is
    gradcheck's; a sparse head can give a query no weight at all; torch's state_dict loads, keeping the sink."""
    torch.manual_seed(0)
    layer = MultiheadAttention(8, 2, batch_first=True, mapping="sparsemax", learn=("sink",)).double()
    plain = MultiheadAttention(8, 2, batch_first=True, mapping="sparsemax").double()
    plain.load_state_dict(torch.nn.MultiheadAttention(8, 2, batch_first=True).double().state_dict())
    layer.load_state_dict(plain.state_dict(), strict=True)  # (torch's keys: the sink keeps its value, 0)
    assert torch.equal(layer.sink.detach(), torch.zeros(2, dtype=torch.float64))
    with torch.no_grad():
        layer.sink.copy_(torch.tensor([0.4, 30.0]))  # (head 1: a sink far above every score takes every weight)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    given = layer.sink.detach().repeat(3).reshape(6, 1, 1).expand(6, 5, 1)
    for need in (False, True):
        out, w = layer(x, x, x, need_weights=need, average_attn_weights=False)
        want, w_want = plain(x, x, x, need_weights=need, average_attn_weights=False, sink=given)
        torch.testing.assert_close(out, want, rtol=1e-13, atol=1e-14)
        if need:
            torch.testing.assert_close(w, w_want, rtol=1e-13, atol=1e-14)
            sums = w[:, 0].sum(-1)
            assert torch.all(w[:, 1] == 0) and torch.all(sums <= 1 + 1e-12) and torch.any(sums < 0.9)
    assert torch.autograd.gradcheck(lambda s: plain(x, x, x, need_weights=False,
                                                   sink=s.repeat(3).reshape(6, 1, 1).expand(6, 5, 1))[0],
                                    (torch.tensor([0.4, -0.5], dtype=torch.float64, requires_grad=True),))
    out = layer(x, x, x, need_weights=False)[0]
    g, = torch.autograd.grad((out * out).sum(), layer.sink)
    with torch.no_grad():
        layer.sink[0] += 1e-6
        up = (layer(x, x, x, need_weights=False)[0] ** 2).sum()
        layer.sink[0] -= 2e-6
        down = (layer(x, x, x, need_weights=False)[0] ** 2).sum()
    assert float(g[0]) == pytest.approx(float((up - down) / 2e-6), rel=1e-6)
    with pytest.raises(ValueError, match="learns its sinks"):
        layer(x, x, x, sink=given)
