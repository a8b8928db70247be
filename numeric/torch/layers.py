"""``MultiheadAttention``: :class:`torch.nn.MultiheadAttention` with any regattn map.

A subclass of :class:`torch.nn.MultiheadAttention` with the same constructor
arguments, parameters (names, shapes, initialisation), ``state_dict``,
``forward`` signature and return values, and three more keyword-only
arguments:

* ``mapping``: the attention map, as :func:`numeric.torch.attention` takes it
  (a name, a generated module, a :class:`~numeric.torch.maps.TorchMap`, or a
  callable ``(scores, dim) -> weights``); ``"softmax"`` by default, which gives
  torch's layer back;
* ``learn``: names of the map's parameters to learn, one value per head
  (``learn=True``: all of them), each kept inside a range ``(lo, hi)`` of its
  declared domain as ``lo + (hi - lo) * sigmoid(<name>_logit)``: the layer's
  parameter ``<name>_logit`` of shape ``(num_heads,)``
  (:func:`numeric.front.learned_range`, as :class:`numeric.MultiHeadAttention`
  learns them).  The range is ``ranges[name]``, else the domain with an
  infinite end put 1 from the other; a learned value starts at the map's
  bound number, else at the range's middle.  ``learn_alpha=True`` is
  ``learn=("alpha",)`` with ``alpha_range`` (``(1.0, 2.0)`` by default:
  softmax's limit to sparsemax) its range: alpha-entmax with alpha learned
  per head (Correia et al. 2019, "Adaptively Sparse Transformers").  ``"sink"`` in ``learn`` learns a sink per
  head instead (:mod:`numeric.constraints.sink`, gpt-oss's): the layer's parameter ``sink`` of shape
  ``(num_heads,)``, starting at 0 (softmax1 with softmax), on the whole real line; a head whose map is sparse can
  then attend to nothing.

A map parameter bound to an :class:`torch.nn.Parameter` (``mapping=get_map(m,
b=nn.Parameter(...))``) is a parameter of the layer too, ``map_<name>``: in
``parameters()``, ``named_parameters()`` and ``state_dict()``.

A ``state_dict`` of :class:`torch.nn.MultiheadAttention` loads into it with
``strict=True``; a learned ``<name>_logit`` missing from the loaded state keeps
its value.  The masks follow ``nn.MultiheadAttention``: a boolean
``key_padding_mask`` or ``attn_mask`` is True where attention is *not*
allowed (the opposite of :func:`~numeric.torch.attention`'s ``attn_mask``), a
float one is added to the scores.  ``is_causal=True`` is the hint torch takes
it for: it needs ``attn_mask`` (torch's error otherwise), and without
``key_padding_mask`` and ``need_weights`` the causal mask is applied by the
attention itself (blocked, no ``L x S`` mask).  Dropout acts on the weights in
training mode.  With ``need_weights=False`` the attention runs through
:func:`~numeric.torch.attention` (memory-efficient for long sequences; with
``backend`` as there: the fused Triton kernels by default on CUDA);
``need_weights=True`` materialises the weights to return them (after dropout,
averaged over the heads or not, as torch does).  A query with no key to
attend to gets weights 0 and attention output 0 (torch gives NaN with
``need_weights=True``).

    >>> import torch
    >>> from numeric.torch import MultiheadAttention
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> layer = MultiheadAttention(8, 2, batch_first=True, mapping="entmax", learn_alpha=True)
    >>> layer.alpha
    tensor([1.5000, 1.5000], grad_fn=<...>)
    >>> x = torch.randn(3, 5, 8)
    >>> out, weights = layer(x, x, x)
    >>> out.shape, weights.shape
    (torch.Size([3, 5, 8]), torch.Size([3, 5, 5]))
"""

from __future__ import annotations

import math
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from .. import front
from . import fused
from ..constraints import SIMPLEX, choose
from ..maps import unbound, with_keywords
from .attention import MapSpec, attention, block_scores, check_constraints, spec_constraints
from .maps import TorchMap, get_map

__all__ = ["MultiheadAttention"]


def in_range(logit, lo: float, hi: float):
    """``lo + (hi - lo) * sigmoid(logit)``, kept strictly inside ``(lo, hi)`` (a learned map parameter's value)."""
    value = lo + (hi - lo) * torch.sigmoid(logit)
    t = logit.detach()
    inside = (torch.nextafter(t.new_tensor(lo), t.new_tensor(hi)), torch.nextafter(t.new_tensor(hi), t.new_tensor(lo)))
    return torch.minimum(torch.maximum(value, inside[0]), inside[1])


def _check_mask_dtype(mask, name: str):
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"{name} must be boolean (True = not allowed) or floating (added), got dtype {mask.dtype}")
    return mask


def _per_head(a, name: str, N: int, H: int, L: int, S: int):
    """``a`` of shape ``(L, S)`` or ``(N * num_heads, L, S)`` (nn.MultiheadAttention's layout of ``attn_mask``) as
    ``(1, 1, L, S)`` or ``(N, H, L, S)``; ``S = 1``: a value per query."""
    if a.dim() == 2 and tuple(a.shape) == (L, S):
        return a.reshape(1, 1, L, S)
    if a.dim() == 3 and tuple(a.shape) == (N * H, L, S):
        return a.reshape(N, H, L, S)
    raise ValueError(f"{name} must have shape (L, S) = {(L, S)} or (N * num_heads, L, S) = {(N * H, L, S)}, "
                     f"got {tuple(a.shape)}")


def _constraint_heads(constraints: dict, N: int, H: int, L: int, S: int, extra: int) -> tuple:
    """``(set, values)``: a call's constraint keywords (:func:`numeric.constraints.choose`) with their tensors laid
    out per head (:func:`_per_head`; a keyword of one value per score ``(L, S)``, one per query ``(L, 1)``) and
    those per score widened by the ``extra`` keys the layer adds, which the set leaves free
    (:attr:`~numeric.constraints.ConstraintSet.free`)."""
    cset, values = choose(constraints)
    out = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            per_score = name in cset.per_score
            value = _per_head(value, name, N, H, L, S if per_score else 1)
            if extra and per_score:
                value = F.pad(value, (0, extra), value=cset.free[name])
        out[name] = value
    return cset, out


def _pad_key(mask):
    """One more key (a bias or zero key/value), allowed for every query."""
    if mask is None:
        return None
    return F.pad(mask, (0, 1), value=False) if mask.dtype == torch.bool else F.pad(mask, (0, 1))


def _combine(masks, dtype):
    """nn.MultiheadAttention's masks (True = not allowed, or added) as one mask for attention() (True = allowed)."""
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    if all(m.dtype == torch.bool for m in masks):
        blocked = masks[0] if len(masks) == 1 else masks[0] | masks[1]
        return blocked.logical_not()
    total = None
    for m in masks:
        add = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(m, -math.inf) if m.dtype == torch.bool \
            else m.to(dtype)
        total = add if total is None else total + add
    return total


class MultiheadAttention(nn.MultiheadAttention):
    """:class:`torch.nn.MultiheadAttention` with any regattn map (module docstring).

    ``mapping``, ``learn``, ``ranges``, ``learn_alpha``, ``alpha_range`` and ``backend`` are the additions;
    every other argument is torch's.  :attr:`learned` holds the learned values per head, :attr:`alpha` the
    per-head alpha in use (learned), or None.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None,
                 vdim=None, batch_first=False, device=None, dtype=None, *, mapping="softmax", learn=(), ranges=None,
                 learn_alpha=False, alpha_range=(1.0, 2.0), backend="auto"):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first, device=device,
                         dtype=dtype)
        if isinstance(mapping, (str, ModuleType, TorchMap)):
            mapping = get_map(mapping)
        elif not callable(mapping):
            raise TypeError("mapping must be a map name, a generated map module, a TorchMap or a callable (scores, dim) "
                            f"-> weights, got {mapping!r}")
        self.mapping = mapping
        self.backend = fused.check_backend(backend)
        if isinstance(mapping, TorchMap):  # (bound nn.Parameters: the layer's, so that they train and are saved)
            for name, value in mapping.params.items():
                if isinstance(value, nn.Parameter):
                    self.register_parameter(f"map_{name}", value)
        learn = (tuple(learn) if learn is not True else True) if learn else ()
        # a sink per head (numeric.constraints.sink): a parameter of the layer, not of the map, on the whole line
        self.learn_sink = learn is not True and "sink" in learn
        if self.learn_sink:
            learn = tuple(n for n in learn if n != "sink")
            self.sink = nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype))
        else:
            self.register_parameter("sink", None)
        ranges = dict(ranges or {})
        if learn_alpha:
            if not isinstance(mapping, TorchMap) or "alpha" not in mapping.module.PARAMETERS:
                name = mapping.name if isinstance(mapping, TorchMap) else repr(mapping)
                raise ValueError(f"learn_alpha=True needs a map with a parameter alpha (e.g. mapping='entmax'); the map "
                                 f"{name} has none")
            learn = learn if learn is True or "alpha" in learn else (*learn, "alpha")
            ranges.setdefault("alpha", alpha_range)
        if isinstance(mapping, TorchMap):
            names, ranges = front.check_learned(mapping.module, learn, ranges)
        elif learn or ranges:
            raise ValueError(f"learn and ranges need a map with parameters, not a callable; got {mapping!r}")
        else:
            names = ()
        self.learn, self.ranges = names, {}
        self.learn_alpha = "alpha" in names
        self.alpha_range = None
        if "alpha" not in names:
            self.register_parameter("alpha_logit", None)
        for name in names:
            start = mapping.params.get(name)
            lo, hi, logit = front.learned_range(mapping.module, name, start if front.is_number(start) else None, ranges.get(name),
                                                "alpha_range" if name == "alpha" and learn_alpha else "range")
            self.ranges[name] = (lo, hi)
            self.register_parameter(f"{name}_logit", nn.Parameter(torch.full((num_heads,), logit, device=device,
                                                                             dtype=dtype)))
        if "alpha" in names:
            self.alpha_range = self.ranges["alpha"]

    def _learned(self, name):
        """``(num_heads,)``: ``lo + (hi - lo) * sigmoid(<name>_logit)``, strictly inside the range."""
        return in_range(getattr(self, f"{name}_logit"), *self.ranges[name])

    @property
    def learned(self) -> dict:
        """``{name: (num_heads,) values}`` of the learned map parameters (in the graph of their logits)."""
        return {name: self._learned(name) for name in self.learn}

    @property
    def alpha(self):
        """``(num_heads,)``: the learned alpha (``lo + (hi - lo) * sigmoid(alpha_logit)``), or None unless learned."""
        return self._learned("alpha") if "alpha" in self.learn else None

    def extra_repr(self) -> str:
        name = self.mapping.name if isinstance(self.mapping, TorchMap) else repr(self.mapping)
        extra = (f", learn={self.learn}, ranges={self.ranges}" if self.learn else "") + \
            (", learn_sink=True" if self.learn_sink else "")
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, mapping={name}{extra}"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        for name in (*(f"{n}_logit" for n in self.learn), *(("sink",) if self.learn_sink else ())):
            if prefix + name in missing_keys:  # torch's layer has none: keep ours
                missing_keys.remove(prefix + name)

    def _map(self):
        if not self.learn:
            return self.mapping
        return get_map(self.mapping, **{name: v.reshape(self.num_heads, 1, 1) for name, v in self.learned.items()})

    def _project(self, query, key, value):
        E = self.embed_dim
        b = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight.chunk(3)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        for name, x, dim in (("query", query, E), ("key", key, self.kdim), ("value", value, self.vdim)):
            if x.shape[-1] != dim:
                raise ValueError(f"{name} must have {dim} features (its last dimension), got shape {tuple(x.shape)}")
        return F.linear(query, w[0], b[0]), F.linear(key, w[1], b[1]), F.linear(value, w[2], b[2])

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, **constraints):
        """``(attn_output, attn_output_weights)`` as :meth:`torch.nn.MultiheadAttention.forward` returns them.

        ``constraints``: the keywords of a constraint set, as :func:`~numeric.torch.attention`'s, each a number or
        a tensor of shape ``(L, S)`` or ``(N * num_heads, L, S)`` like ``attn_mask`` (``(L, 1)`` or ``(N *
        num_heads, L, 1)`` for a keyword of one value per query); a bias key or a zero key added by the layer is
        left free.  The box's ``upper``: a bound on each attention weight (constrained attention: the map over ``0
        <= p <= upper``); a tensor that requires grad gets one (fertility predicted by another module, say).
        """
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        _check_mask_dtype(key_padding_mask, "key_padding_mask")
        _check_mask_dtype(attn_mask, "attn_mask")
        batched = query.dim() == 3
        if query.dim() not in (2, 3):
            raise ValueError(f"query must be 2-D (L, E) unbatched or 3-D batched, got shape {tuple(query.shape)}")
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query, key and value must all be {query.dim()}-D, got shapes {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        if key_padding_mask is not None and key_padding_mask.dim() != query.dim() - 1:
            raise ValueError(f"key_padding_mask must be {query.dim() - 1}-D ({'(N, S)' if batched else '(S,)'}), got shape "
                             f"{tuple(key_padding_mask.shape)}")
        if batched and self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if not batched:
            query, key, value = (x.unsqueeze(1) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        L, N, _ = query.shape
        S = key.shape[0]
        H, D = self.num_heads, self.head_dim
        if key.shape[:2] != value.shape[:2] or key.shape[1] != N:
            raise ValueError(f"key and value must have the query's batch size {N} and one length, got key "
                             f"{tuple(key.shape)} and value {tuple(value.shape)} (sequence first)")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                               "method `generate_square_subsequent_mask` to create this mask.")
        causal = is_causal and key_padding_mask is None and not need_weights
        if causal:
            attn_mask = None
        if attn_mask is not None:
            attn_mask = _per_head(attn_mask, "attn_mask", N, H, L, S)
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise ValueError(f"key_padding_mask must have shape (N, S) = {(N, S)}, got "
                                 f"{tuple(key_padding_mask.shape)}")
            key_padding_mask = key_padding_mask.reshape(N, 1, 1, S)
        q, k, v = self._project(query, key, value)
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        if self.learn_sink and "sink" in constraints:
            raise ValueError("this layer learns its sinks (learn=('sink',)): pass no sink=")
        cset, values = _constraint_heads(with_keywords(self.mapping, constraints), N, H, L, S, extra)
        if self.learn_sink:  # (one per head, (1, H, 1, 1) against the scores (N, H, L, S))
            cset, values = choose({**values, "sink": self.sink.reshape(1, H, 1, 1)})
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.repeat(1, N, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, N, 1)])
            attn_mask, key_padding_mask = _pad_key(attn_mask), _pad_key(key_padding_mask)
        q, k, v = (x.reshape(x.shape[0], N, H, D).permute(1, 2, 0, 3) for x in (q, k, v))  # (N, H, length, D)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(N, H, 1, D)], dim=2)
            v = torch.cat([v, v.new_zeros(N, H, 1, D)], dim=2)
            attn_mask, key_padding_mask = _pad_key(attn_mask), _pad_key(key_padding_mask)
        mask = _combine([attn_mask, key_padding_mask], q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        mapping = unbound(self._map())  # (its name's keywords are in values)
        weights = None
        if need_weights:
            spec_map = mapping if isinstance(mapping, TorchMap) else None
            names = tuple(n for n in spec_map.params if isinstance(spec_map.params[n], torch.Tensor)) if spec_map else ()
            cset, values = check_constraints(values, q, (N, H, L, k.shape[2]))
            if cset is not SIMPLEX and spec_map is None:
                raise TypeError(f"{'='.join(constraints)}= needs a regattn map (a name, a generated module or a "
                                f"TorchMap), not a callable")
            given, tensors = spec_constraints(cset, values)
            spec = MapSpec(mapping, spec_map is not None, names, False, spec_map is None and mask is not None,
                           float(dropout_p), L, L, k.shape[2], given)
            if mask is not None and tuple(torch.broadcast_shapes(mask.shape, (N, H, L, k.shape[2]))) != (N, H, L, k.shape[2]):
                raise ValueError(f"the masks do not broadcast to the weights' shape {(N, H, L, k.shape[2])}")
            a = block_scores(q * (1.0 / math.sqrt(D)), k, mask)
            weights = spec.weights(a, tuple(mapping.params[n] for n in names) + tensors, slice(0, L),
                                   slice(0, k.shape[2]))
            heads = torch.matmul(weights, v)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        else:
            heads = attention(q, k, v, attn_mask=mask, is_causal=causal, mapping=mapping, dropout_p=dropout_p,
                              backend=self.backend, **({} if cset is SIMPLEX else values))
        out = self.out_proj(heads.permute(2, 0, 1, 3).reshape(L, N, self.embed_dim))
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
