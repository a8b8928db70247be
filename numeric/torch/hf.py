"""regattn's maps inside HuggingFace transformers models (the optional extra ``[hf]``).

transformers picks a model's attention by name (``attn_implementation=``, or
``model.set_attn_implementation(name)``) from two registries: the attention
function, and the function that builds the masks it is given.  :func:`register`
fills both for a map and returns the name; :func:`sparsify` switches a loaded
model to a map, optionally with map parameters learned per layer and head.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from numeric.torch import hf
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2)
    >>> model = LlamaForCausalLM(config).eval()
    >>> model = hf.sparsify(model, "entmax", learn=("alpha",), alpha=1.5)
    >>> model.config._attn_implementation      # saved in config.json, which transformers' loader reads
    'regattn_entmax_alpha1.5_learned_alpha'
    >>> hf.learned(model)["model.layers.0.self_attn"]["alpha"]
    tensor([1.5000, 1.5000, 1.5000, 1.5000], grad_fn=<...>)
    >>> model(torch.tensor([[1, 2, 3]])).logits.shape
    torch.Size([1, 3, 32])

What the attention function does, in the terms of transformers' own (its
SDPA function's) contract: queries ``(B, H, T, D)``, keys and values
``(B, H_kv, S, D)`` in, ``(B, T, H, D)`` out; ``scaling`` (``1/sqrt(D)`` when
None); ``dropout`` on the weights (transformers passes 0 in evaluation);
causal or bidirectional from the module's ``is_causal`` where no mask is given,
and the boolean masks transformers builds (padding, causal, sliding window: the
mask function registered is transformers' SDPA mask function, so every mask a
model builds for SDPA it builds for the map); grouped-query attention
(``H = g H_kv``) by broadcasting, with no copy of the keys and values per head;
``output_attentions=True`` returns the weights ``(B, H, T, S)``; gpt-oss's
learned sinks (``s_aux``, one per head: the map over the scores and the sink,
:mod:`numeric.constraints.sink`, with its gradient) and Gemma 2's softcap
(``c tanh(s / c)`` before the mask) for every map.  The map runs
on the computation path of :func:`numeric.torch.attention`: float16 and bfloat16
inputs are computed in float32 and the output cast back, except where the fused
Triton kernels take the call (CUDA tensors; they compute in float32 themselves
and take the half types as they are).  A query with no key to attend to (a
left-padding position) gets output 0, as transformers' SDPA gives with torch
2.13.
"""

from __future__ import annotations

import json
import math
import numbers
import warnings
from pathlib import Path
from types import ModuleType

try:
    import transformers
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError("numeric.torch.hf needs HuggingFace transformers: pip install 'regattn[hf]'",
                              name=exc.name) from None

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .. import front, modifiers
from ..plan import Block, Plan
from . import fused
from .attention import attention, block_scores
from .layers import in_range
from .maps import TorchMap, get_map

__all__ = ["register", "sparsify", "learned", "from_pretrained", "attention_forward"]

#: the prefix of the parameters :func:`sparsify` adds to an attention module (``regattn_alpha_logit``)
PREFIX = "regattn_"
_UNSET = object()
#: keyword arguments of transformers' attention functions that change the scores in ways no map path takes
_UNSUPPORTED = ("sinks",)


def _map_label(tm: TorchMap, params: dict) -> str:
    """``regattn_<map>[_<param><value>...]``: the default registered name (numbers only; no ``/``, which
    transformers reads as a kernel on the Hub)."""
    parts = [f"_{k}{v:g}" if isinstance(v, numbers.Real) else f"_{k}" for k, v in sorted(params.items())]
    return PREFIX + tm.name + "".join(parts)


def _check_params(params: dict) -> None:
    for k, v in params.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"register's map parameters are numbers (one value for every layer and head), got "
                            f"{k}={v!r}; to give values per layer and head, learn them: sparsify(..., learn=({k!r},))")


def _module_name(mapping) -> str:
    """The name :func:`numeric.torch.get_map` finds ``mapping`` by again (what a saved config records)."""
    if isinstance(mapping, str):
        return mapping
    if isinstance(mapping, ModuleType):
        return mapping.__name__
    if isinstance(mapping, TorchMap):
        return mapping.name if mapping.module.__name__.startswith("numeric._generated.") else mapping.module.__name__
    raise TypeError(f"mapping must be a map name, a generated map module or a TorchMap, got {mapping!r}")


def register(mapping, name: str | None = None, *, backend: str = "auto", **params) -> str:
    """Register ``mapping`` with transformers as an attention implementation; return its name.

    Both registries transformers reads are filled under ``name``:
    :class:`transformers.AttentionInterface` with :func:`attention_forward` for
    the map, and :class:`transformers.masking_utils.AttentionMaskInterface` with
    transformers' SDPA mask function (boolean masks, True where a query may
    attend), so that a model given the name builds its padding, causal and
    sliding-window masks.  Without the mask entry transformers would pass no
    mask at all, and padding would be silently ignored.

    Parameters
    ----------
    mapping:
        A map name (``"entmax15"``, ``"entmax"``, a generated module's name), a
        generated module, or a :class:`~numeric.torch.maps.TorchMap`.
    name:
        The name to register under; default ``regattn_<map>`` with the
        parameters' values appended (``regattn_entmax_alpha1.5``).
    backend:
        As :func:`numeric.torch.attention`'s: ``"auto"`` runs the fused Triton
        kernels on CUDA where they cover the call.
    params:
        The map's parameters, numbers (``alpha=1.5``), for every layer and head.

    Returns
    -------
    str
        The name to pass as ``attn_implementation=`` to ``from_pretrained`` or
        ``from_config``, or to ``model.set_attn_implementation``.
    """
    _check_params(params)
    fused.check_backend(backend)
    tm = get_map(mapping, **params)
    return _register(tm, _map_label(tm, params) if name is None else name, backend, params)


def _register(tm: TorchMap, name, backend: str, params: dict, learn: tuple = ()) -> str:
    """:func:`register`'s work for the map ``tm``; ``learn``: the names of the map parameters the modules of a
    model must hold (:func:`sparsify`), without which the map warns that they were not loaded."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a non-empty string without '/' (transformers reads 'a/b' as a kernel on the "
                         f"Hub), got {name!r}")

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if learn and not getattr(module, PREFIX + "ranges", None):
            warnings.warn(f"attention implementation {name!r}: this model was saved with learned map parameters "
                          f"{', '.join(learn)} per head, which the attention modules lack (transformers' own "
                          f"from_pretrained does not load them); the map runs with {params or 'its defaults'} in "
                          f"every head.  Load the model with numeric.torch.hf.from_pretrained", stacklevel=2)
        return attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 is_causal=is_causal, mapping=tm, backend=backend, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"regattn attention with the map {tm.name} {params or ''} (numeric.torch.hf.attention_forward)."
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _learned_map(tm: TorchMap, module, heads: tuple):
    """``tm`` with the module's learned parameters (one per head, :func:`sparsify`) bound, shaped ``heads + (1,
    1)``; ``tm`` itself where the module learns none."""
    ranges = getattr(module, PREFIX + "ranges", None)
    if not ranges:
        return tm
    values = {n: in_range(getattr(module, f"{PREFIX}{n}_logit"), lo, hi) for n, (lo, hi) in ranges.items()}
    return get_map(tm, **{n: v.reshape(heads + (1, 1)) for n, v in values.items()})


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                      *, mapping="softmax", backend: str = "auto", position_bias=None, s_aux=None, softcap=None,
                      **kwargs):
    """transformers' attention function contract, computed with a regattn map (module docstring).

    ``module`` is the attention module calling it (its ``is_causal`` is read
    where ``is_causal`` is None, its learned map parameters where
    :func:`sparsify` added them); ``query`` ``(B, H, T, D)``; ``key``, ``value``
    ``(B, H_kv, S, D)`` with ``H`` a multiple of ``H_kv``; ``attention_mask``
    None, boolean ``(B or 1, 1, T, S)`` (True = may attend) or float (added to
    the scores); ``position_bias`` (``(B or 1, H, T, S)``, added to the scores); ``s_aux`` (gpt-oss's learned sinks,
    ``(H,)``: the map over the scores and one more column, dropped, :mod:`numeric.constraints.sink`); ``softcap``
    (Gemma 2's cap on the scores, ``c tanh(s / c)`` before the mask, :class:`numeric.modifiers.Softcap`).
    Returns ``(output (B, T, H, D_v), weights (B, H, T, S) or None)``, the weights
    when ``output_attentions=True`` is among ``kwargs``.
    """
    for k in _UNSUPPORTED:
        if kwargs.get(k) is not None:
            raise ValueError(f"regattn attention does not support {k}= (the model passed one); use another "
                             f"attn_implementation for this model")
    B, H, T, D = query.shape
    Hk = key.shape[1]
    if H % Hk:
        raise ValueError(f"the query's {H} heads are not a multiple of the keys' {Hk} heads")
    G = H // Hk
    tm = _learned_map(mapping if isinstance(mapping, TorchMap) else get_map(mapping), module, (Hk, G))
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    mask = attention_mask
    # as transformers' SDPA: with no mask the module's causality holds (a single query sees every key)
    causal = bool(is_causal) and mask is None and T > 1
    if position_bias is not None:
        bias = position_bias.reshape(position_bias.shape[0], Hk, G, T, -1) if position_bias.shape[1] == H else \
            position_bias[:, :, None]
        if mask is None:
            mask = bias
        elif mask.dtype == torch.bool:
            mask = torch.where(mask[:, :, None], bias, -math.inf)
        else:
            mask = mask[:, :, None] + bias
    elif mask is not None:
        mask = mask[:, :, None] if mask.dim() == 4 else mask
    dtype = query.dtype
    # the map in float32: half types are cast, unless the fused kernels take them (they compute in float32)
    half = dtype in (torch.float16, torch.bfloat16)
    keep = half and query.is_cuda and backend != "torch" and \
        fused.unsupported(query, mask, tm, True, float(dropout)) is None
    compute = dtype if (not half or keep) else torch.float32
    q = query.reshape(B, Hk, G, T, D).to(compute)
    k, v = key[:, :, None].to(compute), value[:, :, None].to(compute)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(compute)
    sink = {} if s_aux is None else {"sink": s_aux.reshape(Hk, G, 1, 1).to(compute)}
    if kwargs.get("output_attentions"):
        scale = D ** -0.5 if scaling is None else scaling
        cuts = Plan(T, k.shape[-2], causal=causal).cuts(Block(0, T, 0, k.shape[-2]))
        scores = block_scores(q * scale, k, mask, cuts, modifiers.softcap(softcap))
        weights = tm(scores, dim=-1, **sink)
        if dropout > 0:
            weights = F.dropout(weights, dropout, training=True)
        out = torch.matmul(weights, v)
        weights = weights.reshape(weights.shape[0], H, T, -1).to(dtype)
    else:
        out = attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scaling, mapping=tm, dropout_p=float(dropout),
                        backend=backend, softcap=softcap, **sink)
        weights = None
    out = out.reshape(out.shape[0], H, T, -1).transpose(1, 2).contiguous().to(dtype)
    return out, weights


def _attention_modules(model) -> list:
    """``[(qualified name, module)]``: the modules that call transformers' attention function (they hold its
    ``scaling`` and ``is_causal``: Llama's, Qwen2's, GPT-2's and BERT's attention modules, and most others)."""
    found = [(n, m) for n, m in model.named_modules() if hasattr(m, "scaling") and hasattr(m, "is_causal")
             and hasattr(m, "config")]
    if not found:
        raise ValueError(f"found no attention module in {type(model).__name__} (none has the attributes scaling, "
                         f"is_causal and config of transformers' attention modules)")
    return found


def _heads(module) -> int:
    for attr in ("num_heads", "num_attention_heads"):
        n = getattr(module, attr, None)
        if isinstance(n, int):
            return n
    return int(module.config.num_attention_heads)


def sparsify(model, mapping, *, learn=(), ranges=None, backend: str = "auto", **params):
    """Switch a transformers model's attention to ``mapping``; learn the parameters named in ``learn`` per head.

    The map is registered (:func:`register`) and set as the model's attention
    implementation (``model.set_attn_implementation``).  For each name in
    ``learn``, every attention module gets a parameter
    ``regattn_<name>_logit`` of shape ``(num_heads,)``: the value per head is
    ``lo + (hi - lo) * sigmoid(logit)``, kept inside the range ``(lo, hi)``
    (``ranges[name]``, else the domain around the start, as
    :class:`numeric.torch.MultiheadAttention` learns them:
    :func:`numeric.front.learned_range`), starting at ``params[name]`` (else the
    range's middle).  The parameters are in ``model.parameters()`` and
    ``state_dict()``.  The map, its parameters and the ranges are written to
    ``model.config.regattn`` (saved with ``save_pretrained``), from which
    :func:`from_pretrained` sparsifies a loaded model again.

    The attention implementation's name is :func:`register`'s default name
    (``regattn_entmax15``), with ``_learned_<name>`` appended for each learned
    parameter (``regattn_entmax_alpha1.5_learned_alpha``), and is written to
    ``model.config.attn_implementation``, saved as config.json's
    ``"attn_implementation"``.  transformers' own ``from_pretrained`` reads it:
    in a process where the name is registered it runs the map (a model without
    learned parameters is then loaded whole; one with them runs the map without
    their values, and warns), and where the name is not registered it raises
    transformers' ValueError naming it, instead of running SDPA in the map's place.

    Returns the model (changed in place).
    """
    tm = get_map(mapping, **params)
    names, ranges = front.check_learned(tm.module, learn, ranges)
    starts = {k: v for k, v in params.items() if k in names}
    _check_params(params)
    modules = _attention_modules(model)
    spans = {}
    for name in names:
        start = starts.get(name)
        lo, hi, logit = front.learned_range(tm.module, name, start, ranges.get(name))
        spans[name] = (lo, hi, logit)
    for _, module in modules:
        weight = next((w for w in module.parameters() if w.is_floating_point()), None)
        like = {} if weight is None else {"device": weight.device, "dtype": weight.dtype}
        for name, (lo, hi, logit) in spans.items():
            module.register_parameter(f"{PREFIX}{name}_logit", nn.Parameter(torch.full((_heads(module),), logit, **like)))
        setattr(module, PREFIX + "ranges", {name: (lo, hi) for name, (lo, hi, _) in spans.items()})
    # the map registered with the fixed parameters and the learned ones' starts (their values come from the modules)
    label = _register_saved(_module_name(mapping), params, names, backend)
    model.set_attn_implementation(label)
    model.config.regattn = {"mapping": _module_name(mapping), "params": dict(params), "learn": list(names),
                            "ranges": {n: [lo, hi] for n, (lo, hi, _) in spans.items()}, "backend": backend}
    # saved as config.json's "attn_implementation", which transformers' own from_pretrained reads: it runs the map
    # where the name is registered in the loading process and refuses the name where not (never SDPA silently)
    model.config.attn_implementation = label
    return model


def _register_saved(mapping, params: dict, learn, backend: str) -> str:
    """Register the map of a sparsified model under the name its config records: :func:`register`'s default name,
    with ``_learned_<names>`` appended where parameters are learned (the map alone is then not the model's, so
    that name is not one :func:`register` gives)."""
    fused.check_backend(backend)
    _check_params(params)
    tm = get_map(mapping, **params)
    label = _map_label(tm, params) + "".join(f"_learned_{n}" for n in learn)
    return _register(tm, label, backend, params, tuple(learn))


def learned(model) -> dict:
    """``{module name: {parameter: (num_heads,) values}}`` of the map parameters :func:`sparsify` made learned
    (in the graph of their logits)."""
    out = {}
    for n, m in model.named_modules():
        ranges = getattr(m, PREFIX + "ranges", None)
        if ranges:
            out[n] = {k: in_range(getattr(m, f"{PREFIX}{k}_logit"), lo, hi) for k, (lo, hi) in ranges.items()}
    return out


def _checkpoint_tensors(path: Path, keys) -> dict:
    """The tensors ``keys`` of a local checkpoint folder (``model.safetensors``, sharded or not)."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path} holds no model.safetensors (save with model.save_pretrained(path))")
    out = {}
    for f in files:
        out.update({k: v for k, v in load_file(str(path / f)).items() if k in keys})
    return out


def _saved_spec(path, kwargs) -> dict | None:
    """The ``regattn`` entry of the config saved at ``path`` (None if absent; ``kwargs``: from_pretrained's, of
    which the loading ones are passed on), or of the ``config=`` passed."""
    config = kwargs.get("config")
    if config is not None and not isinstance(config, (str, Path)):
        return getattr(config, "regattn", None)
    passed = {k: kwargs[k] for k in ("cache_dir", "revision", "subfolder", "local_files_only", "token") if k in kwargs}
    config_dict, _ = transformers.PreTrainedConfig.get_config_dict(config or path, **passed)
    return config_dict.get("regattn")


def from_pretrained(model_class, path, **kwargs):
    """``model_class.from_pretrained(path, **kwargs)``, sparsified again as it was saved (its learned values
    loaded).

    A model saved after :func:`sparsify` carries its map in ``config.regattn``
    and its learned logits in its weights; transformers' own ``from_pretrained``
    builds the model without them (it does not know the parameters, and drops
    them with a warning).  This registers the attention implementation the
    saved config names, loads the model, sparsifies it from the config and
    loads the learned logits from the folder's safetensors files.  A model
    without ``config.regattn`` is returned as transformers loads it.
    """
    # the learned logits are not the class's parameters: transformers is told to expect them (no load report)
    before = model_class.__dict__.get("_keys_to_ignore_on_load_unexpected", _UNSET)
    model_class._keys_to_ignore_on_load_unexpected = [*(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None)
                                                        or ()), rf"\.{PREFIX}\w+_logit$"]
    try:
        spec = _saved_spec(path, kwargs)
        if spec:  # the name the saved config asks transformers for (a process that never sparsified lacks it)
            _register_saved(spec["mapping"], spec.get("params", {}), spec.get("learn", ()), spec.get("backend", "auto"))
        model = model_class.from_pretrained(path, **kwargs)
    finally:
        if before is _UNSET:
            del model_class._keys_to_ignore_on_load_unexpected
        else:
            model_class._keys_to_ignore_on_load_unexpected = before
    spec = getattr(model.config, "regattn", None)
    if not spec:
        return model
    sparsify(model, spec["mapping"], learn=tuple(spec.get("learn", ())), ranges={k: tuple(v) for k, v in
             spec.get("ranges", {}).items()} or None, backend=spec.get("backend", "auto"), **spec.get("params", {}))
    keys = [k for k in model.state_dict() if k.rpartition(".")[2].startswith(PREFIX)]
    if keys:
        state = _checkpoint_tensors(Path(path), set(keys))
        missing = sorted(set(keys) - set(state))
        if missing:
            raise KeyError(f"the checkpoint in {path} lacks the learned map parameters {missing[:3]}"
                           f"{' ...' if len(missing) > 3 else ''}")
        model.load_state_dict(state, strict=False)
    return model
