"""numeric.torch.hf: regattn maps inside tiny randomly initialised transformers models (Llama with grouped-query
attention, Qwen2 with sliding-window layers, GPT-2, BERT, gpt-oss with learned sinks, Gemma 2 with softcapped scores
and sliding windows), against transformers' own SDPA and eager attention and against themselves (padding, the KV
cache, saving and loading)."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numeric.torch import hf  # noqa: E402
from tests.profile import THOROUGH  # noqa: E402

VOCAB = 64
#: the weights' scale: scores of a few units, where the maps differ (transformers' 0.02 gives near-uniform weights)
INIT = 0.2


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=INIT)
    return transformers.LlamaForCausalLM(cfg)


def _qwen2():
    # layer 0 full attention, layer 1 a sliding window of 3 keys
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_sliding_window=True, sliding_window=3, max_window_layers=1, initializer_range=INIT)
    return transformers.Qwen2ForCausalLM(cfg)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=INIT)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, initializer_range=INIT)
    return transformers.BertModel(cfg, add_pooling_layer=False)


MODELS = {"llama": _llama, "qwen2": _qwen2, "gpt2": _gpt2, "bert": _bert}
DECODERS = ["llama", "qwen2", "gpt2"]
#: torch.compile's backend for the compiled model: inductor (as users compile) in the thorough profile; dynamo's
#: graphs run by aot_eager otherwise (the same traced graphs and autograd, without inductor's minute of codegen)
COMPILER = "inductor" if THOROUGH else "aot_eager"


def _model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return MODELS[kind]().eval()


def _batch(kind: str, seed: int = 1):
    """Token ids ``(3, 9)`` and a padding mask: decoders padded on the left (rows 1 and 2 by 3 and 6 tokens), BERT
    on the right."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    for row, pad in ((1, 3), (2, 6)):
        if kind == "bert":
            mask[row, 9 - pad:] = 0
        else:
            mask[row, :pad] = 0
    return ids, mask


def _run(model, kind, ids, mask, **kw):
    """The model's output of interest: logits (decoders), last hidden states (BERT); positions counted from each
    row's first token, so that a padded row is the same sequence as unpadded."""
    if kind == "bert":
        return model(input_ids=ids, attention_mask=mask, **kw).last_hidden_state
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, **kw).logits


def _real(kind, mask):
    """The positions holding tokens (the padded ones' outputs are not compared)."""
    return mask.bool()


@pytest.mark.parametrize("kind", list(MODELS))
def test_softmax_equals_sdpa_on_padded_batches(kind):
    model = _model(kind)
    ids, mask = _batch(kind)
    with torch.no_grad():
        ref = _run(model, kind, ids, mask)  # transformers' SDPA (the default implementation)
        assert model.config._attn_implementation == "sdpa"
        model.set_attn_implementation(hf.register("softmax"))
        out = _run(model, kind, ids, mask)
    real = _real(kind, mask)
    scale = ref[real].abs().max()
    assert (out[real] - ref[real]).abs().max() <= 2e-6 * scale


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_padded_row_equals_the_row_unpadded(kind):
    model = hf.sparsify(_model(kind), "entmax15")
    ids, mask = _batch(kind)
    with torch.no_grad():
        padded = _run(model, kind, ids, mask)
        for row in (1, 2):
            keep = mask[row].bool()
            alone = _run(model, kind, ids[row:row + 1, keep], mask[row:row + 1, keep])
            assert (padded[row, keep] - alone[0]).abs().max() <= 2e-6 * alone.abs().max()
    # the map is in use: entmax15's outputs are not softmax's
    softmax = hf.sparsify(_model(kind), "softmax")
    with torch.no_grad():
        assert (padded - _run(softmax, kind, ids, mask))[mask.bool()].abs().max() > 1e-3


@pytest.mark.parametrize("kind", DECODERS)
def test_cached_generation_equals_uncached(kind):
    model = hf.sparsify(_model(kind), "entmax15")
    ids, mask = _batch(kind)
    runs = [model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=cache,
                           output_scores=True, return_dict_in_generate=True, pad_token_id=0) for cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    for a, b in zip(runs[0].scores, runs[1].scores):
        assert (a - b).abs().max() <= 2e-5 * b.abs().max()


def test_grouped_query_attention_equals_repeated_keys_and_values():
    """attention_forward's grouped heads (keys and values broadcast to the g query heads of each) against the same
    call with the keys and values repeated per head (transformers' repeat_kv), weights and gradients."""
    from transformers.integrations.sdpa_attention import repeat_kv

    g = torch.Generator().manual_seed(3)
    B, H, Hk, T, D = 2, 6, 2, 5, 8
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hk, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hk, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(B, 1, T, T, generator=g) > 0.3
    mask[..., 0] = True
    module = torch.nn.Module()
    module.is_causal = True
    out, w = hf.attention_forward(module, q, k, v, mask, mapping="entmax15", output_attentions=True)
    ref, w_ref = hf.attention_forward(module, q, repeat_kv(k, H // Hk), repeat_kv(v, H // Hk), mask,
                                      mapping="entmax15", output_attentions=True)
    assert out.shape == (B, T, H, D) and w.shape == (B, H, T, T)
    assert torch.allclose(out, ref, atol=1e-14) and torch.allclose(w, w_ref, atol=1e-14)
    plain, _ = hf.attention_forward(module, q, k, v, mask, mapping="entmax15")  # the blocked path, no weights
    assert torch.allclose(plain, ref, atol=1e-14)
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(plain, (q, k, v), cot)
    grads_ref = torch.autograd.grad(ref, (q, k, v), cot)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b, atol=1e-13)


def test_output_attentions_returns_the_weights():
    model = hf.sparsify(_model("llama"), "entmax15")
    ids, mask = _batch("llama")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2
    T = ids.shape[1]
    allowed = mask.bool()[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
    live = allowed.any(-1)  # a left-padding query sees no key: weights 0
    for w in out.attentions:
        assert w.shape == (3, 4, T, T)
        assert torch.all(w >= 0) and torch.all(w[~allowed.expand_as(w)] == 0)
        sums = w.sum(-1)
        assert torch.allclose(sums[live.expand_as(sums)], torch.ones(()), atol=1e-6)
        assert torch.all(sums[~live.expand_as(sums)] == 0)
        assert (w[allowed.expand_as(w)] == 0).any()  # entmax15 zeroes some allowed keys
    # softmax's weights are the eager implementation's on the live rows
    eager = _model("llama")
    eager.set_attn_implementation("eager")
    soft = hf.sparsify(_model("llama"), "softmax")
    with torch.no_grad():
        a = soft(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        b = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for x, y in zip(a, b):
        rows = live.expand_as(x[..., 0])
        assert (x[rows] - y[rows]).abs().max() <= 1e-6


def test_sliding_window_layers_see_the_window_only():
    model = hf.sparsify(_model("qwen2"), "sparsemax")
    ids, mask = _batch("qwen2")
    with torch.no_grad():
        w = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    T = ids.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    outside = (i - j >= 3) | (j > i)
    assert torch.all(w[1][..., outside] == 0)
    assert (w[0][..., (i - j >= 3)] > 0).any()  # the full layer reaches past the window


def test_half_precision_computes_the_map_in_float32():
    """A bfloat16 or float16 call equals the float32 computation on the same (rounded) inputs, cast back: the map
    never runs in the half type."""
    g = torch.Generator().manual_seed(5)
    module = torch.nn.Module()
    module.is_causal = True
    x = [torch.randn(2, 4, 6, 8, generator=g) for _ in range(3)]
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (t.to(dtype) for t in x)
        out, w = hf.attention_forward(module, q, k, v, None, mapping="entmax15", output_attentions=True)
        ref, w_ref = hf.attention_forward(module, q.float(), k.float(), v.float(), None, mapping="entmax15",
                                          output_attentions=True)
        assert out.dtype == dtype and w.dtype == dtype
        assert torch.equal(out, ref.to(dtype)) and torch.equal(w, w_ref.to(dtype))
        plain, _ = hf.attention_forward(module, q, k, v, None, mapping="entmax15")
        assert torch.equal(plain, ref.to(dtype))


def test_a_bfloat16_model_runs_close_to_float32():
    model = hf.sparsify(_model("llama"), "entmax15")
    ids, mask = _batch("llama")
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
        out = _run(model.to(torch.bfloat16), "llama", ids, mask)
    assert out.dtype == torch.bfloat16
    real = mask.bool()
    assert (out.float()[real] - ref[real]).abs().max() <= 0.05 * ref[real].abs().max()


def test_dropout_drops_weights_in_training():
    g = torch.Generator().manual_seed(6)
    module = torch.nn.Module()
    module.is_causal = False
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    _, w = hf.attention_forward(module, q, k, v, None, mapping="softmax", output_attentions=True)
    torch.manual_seed(0)
    _, wd = hf.attention_forward(module, q, k, v, None, dropout=0.5, mapping="softmax", output_attentions=True)
    kept = wd != 0
    assert 0 < kept.sum() < kept.numel()
    assert torch.allclose(wd[kept], 2 * w[kept])
    torch.manual_seed(0)
    a, _ = hf.attention_forward(module, q, k, v, None, dropout=0.5, mapping="softmax")
    assert not torch.allclose(a, hf.attention_forward(module, q, k, v, None, mapping="softmax")[0])


def _alphas(model):
    return {n: p for n, p in model.named_parameters() if n.endswith("regattn_alpha_logit")}


def test_learned_alphas_get_gradients():
    model = hf.sparsify(_model("llama").double(), "entmax", learn=("alpha",), alpha=1.5)
    logits = _alphas(model)
    assert sorted(logits) == [f"model.layers.{i}.self_attn.regattn_alpha_logit" for i in range(2)]
    for values in hf.learned(model).values():
        assert torch.allclose(values["alpha"], torch.full((4,), 1.5, dtype=values["alpha"].dtype))
    ids, mask = _batch("llama")
    g = torch.Generator().manual_seed(2)
    for p in logits.values():  # apart from the start, so that heads differ
        p.data += 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype)

    def loss():  # (in float64: transformers' own loss is computed in float32)
        logits = model(input_ids=ids, attention_mask=mask).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    loss().backward()
    for name, p in logits.items():
        assert p.grad is not None and torch.all(torch.isfinite(p.grad)) and torch.all(p.grad != 0), name
    # a step against the gradient on the alphas alone lowers the loss
    before = loss().item()
    with torch.no_grad():
        for p in logits.values():
            p -= 1e-2 * p.grad
    assert loss().item() < before


def test_learned_parameter_gradients_are_the_derivative():
    """gradcheck (float64) of one attention call with alpha learned per head, through the module's logits: the
    gradient of the logits and of the inputs."""
    model = hf.sparsify(_model("llama").double(), "entmax", learn=("alpha",), alpha=1.5)
    module = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(8)
    module.regattn_alpha_logit.data = torch.randn(4, generator=g, dtype=torch.float64)
    q = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    fn = transformers.AttentionInterface._global_mapping[model.config._attn_implementation]

    logit = module.regattn_alpha_logit.detach().clone().requires_grad_()
    del module._parameters["regattn_alpha_logit"]  # a plain tensor in its place, in the graph of gradcheck's input

    def call(a, q, k, v):
        module.regattn_alpha_logit = a
        return fn(module, q, k, v, None, scaling=0.5)[0]

    cot = torch.randn(1, 5, 4, 3, generator=g, dtype=torch.float64)
    assert torch.autograd.grad(call(logit, q, k, v), logit, cot)[0].abs().min() > 0  # every head's alpha matters
    assert torch.autograd.gradcheck(call, (logit, q, k, v))


def test_learned_values_stay_in_their_range():
    model = hf.sparsify(_model("gpt2"), "entmax", learn=("alpha",), ranges={"alpha": (1.1, 1.9)})
    for p in _alphas(model).values():
        p.data = torch.tensor([-1e4, -3.0, 3.0, 1e4])
    for values in hf.learned(model).values():
        a = values["alpha"]
        assert torch.all(a > 1.1) and torch.all(a < 1.9)
    assert model.config.regattn["ranges"] == {"alpha": [1.1, 1.9]}


def test_a_sparsified_model_saves_and_loads(tmp_path):
    model = hf.sparsify(_model("llama"), "entmax", learn=("alpha",), alpha=1.3)
    g = torch.Generator().manual_seed(4)
    for p in _alphas(model).values():
        p.data += torch.randn(p.shape, generator=g)
    ids, mask = _batch("llama")
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
    # state_dict into a freshly sparsified model of the same architecture (other weights)
    other = hf.sparsify(_model("llama", seed=9), "entmax", learn=("alpha",), alpha=1.3)
    other.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        assert torch.equal(_run(other, "llama", ids, mask), ref)
    # save_pretrained / from_pretrained
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(transformers.LlamaForCausalLM, tmp_path)
    assert "_keys_to_ignore_on_load_unexpected" not in transformers.LlamaForCausalLM.__dict__  # (put back)
    assert loaded.config.regattn["mapping"] == "entmax" and loaded.config.regattn["learn"] == ["alpha"]
    for name, p in _alphas(model).items():
        assert torch.equal(dict(loaded.named_parameters())[name], p)
    with torch.no_grad():
        assert torch.equal(_run(loaded.eval(), "llama", ids, mask), ref)


def _unregistered(monkeypatch, name):
    """``name`` taken out of transformers' two registries until the test ends (as in a process that never
    registered it)."""
    from transformers.masking_utils import AttentionMaskInterface

    for registry in (transformers.AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping):
        if name in registry:
            monkeypatch.delitem(registry, name)


def test_transformers_own_loader_runs_the_map_or_refuses(tmp_path, monkeypatch):
    """transformers' own from_pretrained (the model class's and AutoModelForCausalLM's) on a model saved after
    sparsify never runs SDPA in the map's place: the saved config names the map's attention implementation, so a
    process that registered it runs the map (the saved model's logits exactly) and one that did not gets
    transformers' ValueError naming it.  A model with learned map parameters is saved under a name of its own
    (transformers' loader cannot load the learned values): refused unless registered, and where registered, the
    map warns that the values are missing; numeric.torch.hf.from_pretrained loads both, registered or not."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    ids, mask = _batch("llama")
    model = hf.sparsify(_model("llama"), "entmax15")
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
        sdpa = _run(_model("llama"), "llama", ids, mask)
    assert (ref - sdpa).abs().max() > 1e-3  # (SDPA's logits are not the map's)
    model.save_pretrained(tmp_path / "fixed")
    with monkeypatch.context() as m:
        _unregistered(m, "regattn_entmax15")
        for loader in (LlamaForCausalLM, AutoModelForCausalLM):
            with pytest.raises(ValueError, match='attn_implementation="regattn_entmax15"'):
                loader.from_pretrained(tmp_path / "fixed")
        loaded = hf.from_pretrained(LlamaForCausalLM, tmp_path / "fixed").eval()
        with torch.no_grad():
            assert torch.equal(_run(loaded, "llama", ids, mask), ref)
    assert hf.register("entmax15") == "regattn_entmax15"
    for loader in (LlamaForCausalLM, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path / "fixed").eval()
        assert loaded.config._attn_implementation == "regattn_entmax15"
        with torch.no_grad():
            assert torch.equal(_run(loaded, "llama", ids, mask), ref)

    model = hf.sparsify(_model("llama"), "entmax", learn=("alpha",), alpha=1.3)
    for p in _alphas(model).values():
        p.data += torch.linspace(-1, 1, p.numel())
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
    name = model.config._attn_implementation
    assert name == "regattn_entmax_alpha1.3_learned_alpha"
    model.save_pretrained(tmp_path / "learned")
    with monkeypatch.context() as m:
        _unregistered(m, name)
        assert hf.register("entmax", alpha=1.3) == "regattn_entmax_alpha1.3"  # the fixed map does not stand in
        with pytest.raises(ValueError, match=f'attn_implementation="{name}"'):
            AutoModelForCausalLM.from_pretrained(tmp_path / "learned")
        loaded = hf.from_pretrained(LlamaForCausalLM, tmp_path / "learned").eval()
        with torch.no_grad():
            assert torch.equal(_run(loaded, "llama", ids, mask), ref)
    bare = AutoModelForCausalLM.from_pretrained(tmp_path / "learned").eval()  # registered in this process
    with pytest.warns(UserWarning, match="learned map parameters .* numeric.torch.hf.from_pretrained"):
        with torch.no_grad():
            _run(bare, "llama", ids, mask)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's import
def test_torch_compile_of_a_model():
    model = hf.sparsify(_model("llama"), "entmax15")
    ids, mask = _batch("llama")
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
        compiled = torch.compile(model, backend=COMPILER)
        out = _run(compiled, "llama", ids, mask)
    real = mask.bool()
    assert (out[real] - ref[real]).abs().max() <= 2e-6 * ref[real].abs().max()


def test_register_names_and_errors():
    assert hf.register("entmax", alpha=1.5) == "regattn_entmax_alpha1.5"
    assert hf.register("sparsemax", name="mine") == "mine"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert "mine" in AttentionInterface._global_mapping and "mine" in AttentionMaskInterface._global_mapping
    with pytest.raises(ValueError, match="without '/'"):
        hf.register("sparsemax", name="a/b")
    with pytest.raises(TypeError, match="learn them"):
        hf.register("entmax", alpha=torch.tensor(1.5))
    with pytest.raises(ValueError, match="no parameter"):
        hf.sparsify(_model("gpt2"), "sparsemax", learn=("alpha",))
    with pytest.raises(ValueError, match="no attention module"):
        hf.sparsify(torch.nn.Linear(2, 2), "sparsemax")
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="sinks"):
        hf.attention_forward(module, q, q, q, None, mapping="softmax", sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="multiple"):
        hf.attention_forward(module, torch.randn(1, 3, 3, 4), q, q, None, mapping="softmax")


@pytest.mark.parametrize("mapping", ["gini_log1p", "cube"])
def test_a_typed_map_in_a_model(mapping):
    """A user's map with no closed-form link (p**2/2 + p log(1 + p): Newton; p**3: sparse) in a Llama: a padded row
    equals it unpadded, cached generation equals uncached, and the map is in use (its output is not softmax's)."""
    model = hf.sparsify(_model("llama"), mapping)
    ids, mask = _batch("llama")
    with torch.no_grad():
        padded = _run(model, "llama", ids, mask)
        keep = mask[2].bool()
        alone = _run(model, "llama", ids[2:3, keep], mask[2:3, keep])
        assert (padded[2, keep] - alone[0]).abs().max() <= 2e-6 * alone.abs().max()
        softmax = _run(hf.sparsify(_model("llama"), "softmax"), "llama", ids, mask)
        assert (padded - softmax)[mask.bool()].abs().max() > 1e-3
    runs = [model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, use_cache=cache,
                           output_scores=True, return_dict_in_generate=True, pad_token_id=0) for cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    for a, b in zip(runs[0].scores, runs[1].scores):
        assert (a - b).abs().max() <= 2e-5 * b.abs().max()


def _gpt_oss():
    """gpt-oss: a learned sink per head (``s_aux``), a sliding layer and a full one; sinks drawn N(0, 1) (the model
    initialises them to 0)."""
    cfg = transformers.GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                    num_experts_per_tok=1, max_position_embeddings=64, sliding_window=3,
                                    initializer_range=INIT, layer_types=["sliding_attention", "full_attention"],
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = transformers.GptOssForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()
    return model


def _gemma2():
    """Gemma 2 with a softcap that binds (2: scores of a few units are squashed) and a sliding layer."""
    cfg = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                    sliding_window=3, attn_logit_softcapping=2.0, initializer_range=INIT)
    return transformers.Gemma2ForCausalLM(cfg)


SINKS_AND_CAPS = {"gpt_oss": _gpt_oss, "gemma2": _gemma2}


@pytest.mark.parametrize("kind", list(SINKS_AND_CAPS))
def test_sinks_and_softcaps_equal_eager_attention(kind):
    """With softmax, regattn's attention equals transformers' eager attention (gpt-oss's sinks, Gemma 2's softcap,
    both models' sliding windows) on a padded batch, to 1e-5 in float32."""
    torch.manual_seed(0)
    model = SINKS_AND_CAPS[kind]().eval()
    ids, mask = _batch("llama")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = _run(model, "llama", ids, mask)
        model.set_attn_implementation(hf.register("softmax"))
        out = _run(model, "llama", ids, mask)
    real = _real("llama", mask)
    assert (out[real] - ref[real]).abs().max() <= 1e-5 * ref[real].abs().max()


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("kind", list(SINKS_AND_CAPS))
def test_every_map_runs_with_sinks_and_softcaps(kind, mapping):
    """Another map in place of softmax: its attention function equals numeric.torch.attention with the model's
    sinks and softcap on the same queries, keys and values (captured from the model's layer)."""
    torch.manual_seed(0)
    model = SINKS_AND_CAPS[kind]().eval()
    name = hf.register(mapping)
    model.set_attn_implementation(name)
    seen = []
    attn = model.model.layers[1].self_attn
    hook = attn.register_forward_hook(lambda mod, args, kwargs, out: seen.append((kwargs, out)), with_kwargs=True)
    ids, mask = _batch("llama")
    with torch.no_grad():
        logits = _run(model, "llama", ids, mask)
    hook.remove()
    assert torch.isfinite(logits[_real("llama", mask)]).all() and seen
    from numeric.torch import attention

    q = torch.randn(1, 4, 5, 8)
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    extra = {"s_aux": attn.sinks} if kind == "gpt_oss" else {"softcap": model.config.attn_logit_softcapping}
    out, _ = hf.attention_forward(attn, q, k, v, None, scaling=attn.scaling, is_causal=True, mapping=mapping, **extra)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    keywords = {"sink": attn.sinks} if kind == "gpt_oss" else {"softcap": model.config.attn_logit_softcapping}
    want = attention(q, kr, vr, is_causal=True, scale=attn.scaling, mapping=mapping, **keywords)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-6, atol=1e-6)


def test_a_sparsified_gpt_oss_keeps_its_sinks_and_their_gradient():
    """hf.sparsify(gpt-oss, "entmax15"): the sinks stay the model's parameters, and their gradient is the derivative
    of the loss (a central difference; float32, as gpt-oss's experts multiply in no other dtype on the CPU, so a step
    of 1e-2)."""
    torch.manual_seed(0)
    model = hf.sparsify(_gpt_oss(), "entmax15")
    ids, mask = _batch("llama")
    sinks = model.model.layers[0].self_attn.sinks

    def loss():
        return _run(model, "llama", ids, mask).logsumexp(-1).sum()

    loss().backward()
    assert sinks.grad is not None and torch.isfinite(sinks.grad).all() and sinks.grad.abs().max() > 0
    with torch.no_grad():
        for h in range(sinks.numel()):
            sinks[h] += 1e-2
            up = loss()
            sinks[h] -= 2e-2
            down = loss()
            sinks[h] += 1e-2
            assert float(sinks.grad[h]) == pytest.approx(float((up - down) / 2e-2), rel=2e-2, abs=2e-3)
