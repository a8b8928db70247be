"""numeric.torch.MultiheadAttention against torch.nn.MultiheadAttention (loaded weights), gradcheck and learned alpha."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from numeric.torch.layers import MultiheadAttention  # noqa: E402
from numeric.torch.maps import get_map  # noqa: E402

from .conftest import RecordingMap  # noqa: E402

F64 = torch.float64
E, H = 8, 2


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _pair(seed, **kw):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, dtype=F64, **kw)
    ours = MultiheadAttention(E, H, dtype=F64, **kw)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def _inputs(seed, N=3, L=4, S=5, kdim=E, vdim=E, batch_first=False, batched=True):
    g = _gen(seed)

    def make(n, length, e):
        shape = (n, length, e) if batch_first else (length, n, e)
        return torch.randn(*(shape if batched else (length, e)), generator=g, dtype=F64, requires_grad=True)

    return make(N, L, E), make(N, S, kdim), make(N, S, vdim)


def _masks(seed, kind, N=3, L=4, S=5, batched=True):
    """Masks in nn.MultiheadAttention's convention (True = not allowed); key 0 is always allowed (no fully masked row)."""
    g = _gen(seed)

    def blocked(*shape):
        m = torch.rand(*shape, generator=g) < 0.35
        m[..., 0] = False
        return m

    kw = {}
    if kind in ("kpm-bool", "both-bool"):
        kw["key_padding_mask"] = blocked(N, S) if batched else blocked(S)
    if kind == "kpm-float":
        kw["key_padding_mask"] = torch.randn(N, S, generator=g, dtype=F64)
    if kind in ("am-bool", "both-bool"):
        kw["attn_mask"] = blocked(L, S)
    if kind == "am-float-3d":
        kw["attn_mask"] = torch.randn(N * H, L, S, generator=g, dtype=F64).masked_fill(blocked(N * H, L, S), -math.inf)
    if kind == "both-mixed":
        kw["key_padding_mask"] = torch.randn(N, S, generator=g, dtype=F64)
        kw["attn_mask"] = torch.randn(L, S, generator=g, dtype=F64).masked_fill(blocked(L, S), -math.inf)
    return kw


def _check_same(ref_out, out, inputs, params_ref, params_ours, atol=1e-13):
    (ya, wa), (yb, wb) = ref_out, out
    torch.testing.assert_close(yb, ya, rtol=0, atol=atol)
    assert (wa is None) == (wb is None)
    if wa is not None:
        torch.testing.assert_close(wb, wa, rtol=0, atol=atol)
    g = torch.randn(ya.shape, generator=_gen(5), dtype=F64)
    ga = torch.autograd.grad((ya * g).sum(), [*inputs, *params_ref], allow_unused=True)
    gb = torch.autograd.grad((yb * g).sum(), [*inputs, *params_ours], allow_unused=True)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a, rtol=0, atol=atol)


CONFIGS = {"default": {}, "batch_first": dict(batch_first=True), "kdim-vdim": dict(kdim=5, vdim=3),
           "bias_kv": dict(add_bias_kv=True), "zero_attn": dict(add_zero_attn=True), "no-bias": dict(bias=False),
           "all": dict(add_bias_kv=True, add_zero_attn=True, kdim=6, vdim=7, batch_first=True)}


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", ["none", "kpm-bool", "kpm-float", "am-bool", "am-float-3d", "both-bool", "both-mixed"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_softmax_layer_equals_torch(config, masks, need_weights, average):
    kw = CONFIGS[config]
    ref, ours = _pair(1, **kw)
    q, k, v = _inputs(2, kdim=kw.get("kdim", E), vdim=kw.get("vdim", E), batch_first=kw.get("batch_first", False))
    m = _masks(3, masks)
    call = dict(need_weights=need_weights, average_attn_weights=average, **m)
    _check_same(ref(q, k, v, **call), ours(q, k, v, **call), (q, k, v), list(ref.parameters()), list(ours.parameters()))


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", ["none", "kpm-bool", "am-bool"])
def test_unbatched_inputs(masks, need_weights):
    ref, ours = _pair(4, batch_first=True)
    q, k, v = _inputs(5, batched=False)
    call = dict(need_weights=need_weights, average_attn_weights=False, **_masks(6, masks, batched=False))
    _check_same(ref(q, k, v, **call), ours(q, k, v, **call), (q, k, v), list(ref.parameters()), list(ours.parameters()))


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("kpm", [False, True])
def test_is_causal_hint(kpm, need_weights):
    ref, ours = _pair(7, batch_first=True)
    q, _, _ = _inputs(8, L=6, S=6, batch_first=True)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)  # True = not allowed (bool, as the padding mask)
    call = dict(attn_mask=causal, is_causal=True, need_weights=need_weights)
    if kpm:
        call["key_padding_mask"] = _masks(9, "kpm-bool", L=6, S=6)["key_padding_mask"]
    _check_same(ref(q, q, q, **call), ours(q, q, q, **call), (q,), list(ref.parameters()), list(ours.parameters()))
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ours(q, q, q, is_causal=True)


def test_dropout_on_the_weights_as_torch():
    """In training mode with need_weights, the same seed drops the same weights as torch's layer."""
    ref, ours = _pair(10, dropout=0.4, batch_first=True)
    q, k, v = _inputs(11, batch_first=True)
    torch.manual_seed(12)
    a = ref(q, k, v)
    torch.manual_seed(12)
    b = ours(q, k, v)
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(b[1], a[1], rtol=0, atol=1e-13)
    assert bool((ours(q, k, v, average_attn_weights=False)[1] == 0).any())  # some weights dropped
    ours.eval()
    ref.eval()
    torch.testing.assert_close(ours(q, k, v, need_weights=False)[0], ref(q, k, v)[0], rtol=0, atol=1e-13)


def test_dropout_without_weights_is_random_in_training_only():
    ours = _pair(13, dropout=0.5)[1]
    q, k, v = _inputs(14)
    first, second = ours(q, k, v, need_weights=False)[0], ours(q, k, v, need_weights=False)[0]
    assert not torch.equal(first, second)
    ours.eval()
    assert torch.equal(ours(q, k, v, need_weights=False)[0], ours(q, k, v, need_weights=False)[0])


# ------------------------------------------------------------------ state_dict
def test_state_dict_round_trips_with_torch():
    torch.manual_seed(20)
    ref = torch.nn.MultiheadAttention(E, H, kdim=5, vdim=3, add_bias_kv=True)
    ours = MultiheadAttention(E, H, kdim=5, vdim=3, add_bias_kv=True, mapping="entmax15")
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = torch.nn.MultiheadAttention(E, H, kdim=5, vdim=3, add_bias_kv=True)
    back.load_state_dict(ours.state_dict(), strict=True)
    for name, value in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], value)


def test_learned_alpha_keeps_its_value_when_the_state_lacks_it():
    ref = torch.nn.MultiheadAttention(E, H)
    ours = MultiheadAttention(E, H, mapping=get_map("entmax", alpha=1.3), learn_alpha=True)
    before = ours.alpha_logit.detach().clone()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert torch.equal(ours.alpha_logit.detach(), before)
    torch.testing.assert_close(ours.alpha.detach(), torch.full((H,), 1.3), rtol=0, atol=1e-6)
    state = ours.state_dict()
    state["alpha_logit"] = torch.tensor([-1.0, 2.0])
    ours.load_state_dict(state, strict=True)
    assert torch.equal(ours.alpha_logit.detach(), torch.tensor([-1.0, 2.0]))
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ref.load_state_dict(state, strict=True)


# ------------------------------------------------------------------ learned alpha
def test_learned_alpha_gets_a_gradient_and_stays_in_range():
    torch.manual_seed(30)
    layer = MultiheadAttention(E, H, batch_first=True, mapping="entmax", learn_alpha=True, alpha_range=(1.1, 1.8))
    torch.testing.assert_close(layer.alpha.detach(), torch.full((H,), 1.45))
    x = torch.randn(2, 6, E)
    target = torch.randn(2, 6, E)
    opt = torch.optim.SGD([layer.alpha_logit], lr=0.5)
    for step in range(6):
        opt.zero_grad()
        out, _ = layer(x, x, x, need_weights=step % 2 == 0)
        ((out - target) ** 2).sum().backward()
        assert layer.alpha_logit.grad is not None and bool((layer.alpha_logit.grad != 0).all())
        opt.step()
        alpha = layer.alpha.detach()
        assert bool(((1.1 < alpha) & (alpha < 1.8)).all())
    with torch.no_grad():
        layer.alpha_logit.fill_(1e4)
    assert float(layer.alpha.detach().max()) < 1.8
    layer(x, x, x)  # an alpha pressed against the range's end still runs


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_layer_with_alpha_logits(need_weights):
    torch.manual_seed(40)
    layer = MultiheadAttention(4, 2, dtype=F64, mapping="entmax", learn_alpha=True, batch_first=True, add_bias_kv=True)
    params = dict(layer.named_parameters())
    names = ["alpha_logit", "in_proj_weight", "bias_k"]
    x = torch.randn(2, 3, 4, dtype=F64, requires_grad=True)
    kpm = torch.tensor([[False, True, False], [False, False, True]])

    def f(x, *values):
        state = {**params, **dict(zip(names, values))}
        out, w = torch.func.functional_call(layer, state, (x, x, x), dict(key_padding_mask=kpm, need_weights=need_weights))
        return out if w is None else (out, w)

    logits = torch.tensor([-0.3, 0.8], dtype=F64, requires_grad=True)
    values = [logits] + [params[n].detach().clone().requires_grad_() for n in names[1:]]
    assert torch.autograd.gradcheck(f, (x, *values))


# ------------------------------------------------------------------ other maps, long sequences
def test_without_weights_the_layer_attends_in_blocks():
    from numeric.torch.attention import BLOCK_ENTRIES

    rec = RecordingMap("sparsemax")
    layer = MultiheadAttention(E, H, batch_first=True, mapping=rec)
    L = 1500
    rows = BLOCK_ENTRIES // (H * L)
    x = torch.randn(1, L, E)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    out, w = layer(x, x, x, need_weights=False, attn_mask=mask, is_causal=True)
    assert w is None and rows < L and max(shape[-2] for shape in rec.calls) == rows
    forward = len(rec.calls)
    out.sum().backward()
    assert len(rec.calls) > forward and max(shape[-2] for shape in rec.calls) == rows


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(mapping="softmax", learn_alpha=True), ValueError, "learn_alpha=True needs a map with a parameter alpha"),
    (dict(mapping=lambda s, dim: s.softmax(dim), learn_alpha=True), ValueError, "needs a map with a parameter alpha"),
    (dict(mapping="entmax", learn_alpha=True, alpha_range=(-0.5, 2.0)), ValueError, "alpha_range"),
    (dict(mapping="entmax", learn_alpha=True, alpha_range=(2.0, 1.5)), ValueError, "alpha_range"),
    (dict(mapping="entmax", learn_alpha=True, alpha_range=(0.0, math.inf)), ValueError, "alpha_range"),
    (dict(mapping=3), TypeError, "mapping must be"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiheadAttention(E, H, **kwargs)


@pytest.mark.parametrize(("call", "error", "match"), [
    (dict(attn_mask=torch.zeros(4, 4, dtype=torch.bool)), ValueError, "attn_mask must have shape"),
    (dict(attn_mask=torch.zeros(4, 5, dtype=torch.int64)), TypeError, "attn_mask must be boolean"),
    (dict(key_padding_mask=torch.zeros(3, 4, dtype=torch.bool)), ValueError, "key_padding_mask must have shape"),
    (dict(key_padding_mask=torch.zeros(5, dtype=torch.bool)), ValueError, "key_padding_mask must be 2-D"),
    (dict(key_padding_mask=torch.zeros(3, 5, dtype=torch.int32)), TypeError, "key_padding_mask must be boolean"),
])
def test_forward_errors(call, error, match):
    layer = MultiheadAttention(E, H, dtype=F64)
    q, k, v = _inputs(60)
    with pytest.raises(error, match=match):
        layer(q, k, v, **call)


def test_input_shape_errors():
    layer = MultiheadAttention(E, H, dtype=F64, kdim=5)
    q, k, v = _inputs(61, kdim=5)
    with pytest.raises(ValueError, match="key must have 5 features"):
        layer(q, v, v)
    with pytest.raises(ValueError, match="query must be 2-D"):
        layer(q[0, 0], k, v)
    with pytest.raises(ValueError, match="query, key and value must all be 3-D"):
        layer(q, k[0], v)
    with pytest.raises(ValueError, match="key and value must have the query's batch size"):
        layer(q, k[:, :2], v[:, :2])
