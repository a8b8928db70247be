"""Fused attention through the Triton kernels of :mod:`numeric.kernels.triton_attention` and a map's functions.

:func:`numeric.torch.attention` runs here with ``backend="triton"`` (and by default
on CUDA tensors when Triton is installed): one forward kernel computes each query
block's weights and output without writing the weights to memory, and two
backward kernels recompute them from each row's threshold.  The kernels are the
same for every map and constraint set; the map's ``@triton.jit`` functions (its module's
``TRITON_SOURCE``, :mod:`derive.codegen.triton`) are their ``MAP`` argument, the set
(the simplex, or the box with ``upper``) their ``SET``.  On CPU tensors the
kernels run in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` in the
environment before Triton is first imported.

A call the kernels do not cover runs the blocked torch path instead, after a
warning (once per reason) that says why: see :func:`unsupported`.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import math
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from .. import family
from ..constraints.base import left_out

__all__ = ["unsupported", "unsupported_set", "set_arguments", "steep_at_clip", "check_backend", "fused_attention",
           "check_bounds", "case_groups",
           "grouped_attention",
           "BACKENDS", "BLOCK", "KEEP"]

#: Query and key rows per block: (on CUDA, in Triton's interpreter).
BLOCK = {"cuda": 64, "cpu": 16}
#: Largest scores the forward keeps per row from its first pass (a multiple of the block's width): a sparse
#: row whose support fits in them is solved with no pass over the keys, and the others model only the scores
#: left out (see numeric.kernels.triton_attention).
KEEP = {"cuda": 64, "cpu": 64}
#: Newton / bisection steps of the threshold at most (float32 converges in far fewer; bisection alone halves a
#: bracket of width <= omega'(1) - omega'(1/n) to float32's resolution within ~40).
MAX_STEPS = 60

_lock = threading.Lock()
_loaded: dict = {}
_folder: Path | None = None
_warned: set = set()


def _triton():
    try:
        import triton
    except ImportError:
        return None
    return triton


#: the values of ``backend`` (numeric.torch.attention, MultiheadAttention)
BACKENDS = ("auto", "torch", "triton")


def check_backend(backend) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend


def unsupported(query, attn_mask, fn, is_map: bool, dropout_p: float, cset=None) -> str | None:
    """Why the Triton kernels cannot run this call (``None``: they can); ``cset``: its constraint set (a map
    without a sum, which solves no threshold, may have any link)."""
    triton = _triton()
    if triton is None:
        return "Triton is not installed (pip install triton)"
    if not is_map:
        return "the mapping is a plain callable: the kernels need a generated map"
    if fn.family is not None and fn.family.fused is None:
        return f"{fn.name} has no fused kernels (its regularizer is not separable)"
    if query.device.type == "cpu" and not triton.knobs.runtime.interpret:
        return "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before Triton is imported"
    if query.device.type not in ("cpu", "cuda"):
        return f"device {query.device.type!r} has no Triton kernels"
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {query.dtype}: the kernels compute in float32 and take float32, float16 and bfloat16"
    if dropout_p > 0:
        return "dropout is not fused"
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.requires_grad:
        return "a float attn_mask that requires grad (its gradient is not computed by the kernels)"
    for name, value in fn.params.items():
        if isinstance(value, torch.Tensor) and value.requires_grad and torch.is_grad_enabled():
            return f"parameter {name} requires grad (the kernels give no parameter gradients)"
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[-2] != 1:
            return f"parameter {name} varies along the queries (the kernels take one value per batch and head)"
    module = _case(fn)
    if family.is_family(module):
        return (f"map {module.NAME}: the values of {module.FAMILY_PARAMETER} do not all lie in one of its open cases "
                "(the kernels run one case's functions)")
    return None if cset is not None and cset.fused == "nosum" else steep_at_clip(module, fn.params)


def _case(fn):
    """The module the kernels run for the map ``fn``: its own, or a family's case (:func:`numeric.family.resolve`)."""
    return family.resolve(fn.module, fn.params, lambda a: a.detach())


def steep_at_clip(module, params: dict) -> str | None:
    """Why a sparse map's link is too steep at the clip for the kernels' float32 threshold (``None``: it is not), or
    why the kernels' bracket of it does not exist (omega's domain ends at 1).

    Near the clip the link rises like ``g(clip + u) ~ u**k`` and its weight like ``w(p) ~ p**(1 - 1/k)``;
    for ``k < 1`` the derivative of ``F(tau) = sum g_+(s - tau)`` is infinite where a score enters the
    support, and one float32 ulp of ``tau`` there moves that score's ``p`` by about ``(a ulp)**k``.  The
    kernels solve ``F(tau) = 1`` in float32 and rebuild ``p = g_+(s - tau) / F`` from ``tau`` alone; for
    ``k < 1/2`` (``w`` growing faster than ``1/p``: alpha-entmax beyond alpha = 3) that leaves errors of
    the order of ``p`` itself (measured in Triton's interpreter: 8e-3 at alpha = 4, 0.08 at 6, 0.75 at
    10), which the torch path's solver avoids (it combines the ends of a bracket across the kink).  The
    exponent is read off the weight, ``1 - 1/k = d log w / d log p`` between ``p = 1e-12`` and ``1e-8``,
    for every value of the parameters.
    """
    # (a parameter tensor is read back: one synchronisation; the verdict is cached by module and values)
    return _steep(module, tuple(tuple(np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v,
                                                 dtype=np.float64).reshape(-1).tolist())
                                for v in (params[name] for name in module.PARAMETERS)))


@functools.lru_cache(maxsize=256)
def _steep(module, values: tuple) -> str | None:
    """:func:`steep_at_clip` for the parameters' values, as tuples of floats."""
    values = np.broadcast_arrays(*(np.array(v, dtype=np.float64) for v in values)) if values else []
    with np.errstate(all="ignore"):
        clip = np.broadcast_to(np.asarray(module.clip(*values), dtype=np.float64), np.shape(values[0]) if values else ())
        small, large = (np.asarray(module.weight(np.float64(p), *values), dtype=np.float64) for p in (1e-12, 1e-8))
        slope = (np.log(large) - np.log(small)) / math.log(1e4)
        one = np.asarray(module.omega_prime(np.float64(1.0), *values), dtype=np.float64)
    if not np.isfinite(one).all():
        return (f"map {module.NAME}: its domain ends at p = 1 (omega'(1) = +oo), and the kernels' threshold bracket "
                "starts at -omega'(1)")
    steep = np.isfinite(clip) & ~(slope >= -1 - 1e-9)  # (an overflowing weight: NaN slope, steep)
    if not steep.any():
        return None
    worst = float(np.nanmin(np.where(steep, slope, np.inf))) if np.isfinite(slope[steep]).any() else -math.inf
    return (f"map {module.NAME}: its link rises from the clip like u**k with k = {1 / (1 - worst):.3g} < 1/2 (weight "
            f"~ p**{worst:.3g}), steeper than the kernels' float32 threshold resolves")


def warn_fallback(reason: str) -> None:
    """One warning per reason: this call runs the blocked torch path."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"numeric.torch.attention: backend 'triton' falls back to the torch path: {reason}",
                      RuntimeWarning, stacklevel=3)


def map_functions(module):
    """The :class:`~numeric.kernels.triton_attention.MapFunctions` of ``module.TRITON_SOURCE``, imported from a
    file (Triton reads its functions' source).  A link with no closed form calls the generated
    ``numeric._generated.newton_link_triton``, whose header is checked first (as a map's is)."""
    global _folder
    if family.is_family(module):
        raise TypeError(f"map {module.NAME} is a family: its kernels are those of its cases "
                        "(numeric.family.resolve picks the case of the parameters' values)")
    text = module.TRITON_SOURCE
    found = _loaded.get(text)  # (by the text itself: a str caches its hash, so a call hashes nothing)
    if found is not None:
        return found
    from numeric import contract, trust
    from numeric.kernels.triton_attention import MapFunctions

    if module.link is None:
        contract.check_format(trust.import_generated("numeric._generated.newton_link_triton"))

    with _lock:
        if text in _loaded:
            return _loaded[text]
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="regattn-triton-"))
            atexit.register(shutil.rmtree, _folder, True)
        name = f"regattn_triton_{module.NAME}_{key}"
        path = _folder / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        found = MapFunctions(*(getattr(mod, field) for field in MapFunctions._fields))
        _loaded[text] = found
        return found


def _heads(t, batch, rows, cols):
    """``t`` expanded to ``batch + (rows, cols)`` as ``(B, H, rows, cols)`` (a view where the strides allow)."""
    t = t.expand(batch + (rows, cols))
    if len(batch) == 0:
        return t.reshape(1, 1, rows, cols)
    return t.reshape(-1, batch[-1], rows, cols)


def _param_values(fn, batch, B, H, device):
    """The map's parameters, one value per (batch, head): a ``(B * H, n)`` float32 tensor."""
    values = []
    for name in fn.module.PARAMETERS:
        value = fn.params[name]
        t = torch.as_tensor(value, dtype=torch.float32, device=device)
        t = t.reshape(t.shape[:-2] if t.dim() >= 2 else ()).expand(batch) if t.dim() else t.expand(batch)
        values.append(t.reshape(B * H))
    if not values:
        return torch.zeros(B * H, 1, dtype=torch.float32, device=device)
    return torch.stack(values, dim=1).contiguous()


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, upper, scale, causal, module, fns, params, shapes, scores, column, nosum):
        B, H, L, S, E, EV = shapes
        block = BLOCK["cuda" if q.is_cuda else "cpu"]
        nq, nk = math.ceil(L / block), math.ceil(S / block)
        out = torch.empty(B, H, L, EV, dtype=q.dtype, device=q.device)
        tau = torch.empty(B * H, L, dtype=torch.float32, device=q.device)
        fsum = torch.empty_like(tau)
        support = torch.zeros(B * H, nq, nk, dtype=torch.int8, device=q.device)
        bmax = torch.empty(B * H, nq, nk, dtype=torch.float32, device=q.device)  # (a scratch of the forward)
        m, ms = _mask_args(mask, q)
        be, bev = max(16, _triton().next_power_of_2(E)), max(16, _triton().next_power_of_2(EV))
        exp_link = bool(module.TERM_IS_EXP) and module.LINK_FORM == "exp"
        # what the backward's c = dO . U / sum w needs: U = sum_j w_j v_j and sum_j w_j per row, where it will run
        weighted = any(ctx.needs_input_grad[:3]) or ctx.needs_input_grad[4] or ctx.needs_input_grad[12]
        u = torch.empty(B * H, L, EV, dtype=torch.float32, device=q.device) if weighted else fsum
        wsum = torch.empty_like(tau) if weighted else fsum
        kt = _kernels()
        window, cap = scores  # (WINDOW 0: none, SOFTCAP 0: none; a window implies causal)
        flags = dict(HAS_MASK=mask is not None, MASK_BOOL=mask is None or mask.dtype == torch.bool,
                     CAUSAL=causal or window > 0, WINDOW=window, SOFTCAP=cap, MAX_STEPS=MAX_STEPS, WEIGHTED=weighted,
                     BLOCK_M=block, BLOCK_N=block, BLOCK_E=be, BLOCK_EV=bev,
                     UPCAST=not q.is_cuda, MAP=fns, **_options(q))
        # the constraint set, SET: the simplex, or the box 0 <= p <= upper with its Ceiling (omega'(inf) per batch and
        # head); the simplex's bounds and ceiling are placeholders the kernel does not read
        ceiling = tau if upper is None else _ceiling(module, params)
        bounds, us = _bounds_args(upper, q)
        kt.attention_forward[(nq, B * H)](q, k, v, out, tau, fsum, support, bmax, m, params, u, wsum, bounds, ceiling,
                                          tau if column is None else column, H, L, S, E, EV, float(scale), nk,
                                          params.shape[1], *q.stride(), *k.stride(), *v.stride(), *out.stride(), *ms,
                                          *us, SET=_set(upper, column, nosum),
                                          EXP_LINK=exp_link, KEEP=KEEP["cuda" if q.is_cuda else "cpu"], **flags)
        ctx.save_for_backward(q, k, v, mask, upper, params, tau, fsum, support, u, wsum, column)
        ctx.ceiling = None if upper is None else ceiling  # (the backward reads the bounds at the same ceiling)
        ctx.args = (scale, causal, fns, shapes, block, be, bev, scores, nosum)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask, upper, params, tau, fsum, support, u, wsum, column = ctx.saved_tensors
        scale, causal, fns, (B, H, L, S, E, EV), block, be, bev, (window, cap), nosum = ctx.args
        nq, nk = math.ceil(L / block), math.ceil(S / block)
        do = dout.contiguous()
        dq = torch.empty(B * H, L, E, dtype=torch.float32, device=q.device)
        dk = torch.empty(B * H, S, E, dtype=torch.float32, device=q.device)
        dv = torch.empty(B * H, S, EV, dtype=torch.float32, device=q.device)
        c = torch.empty_like(tau)
        dcolumn = c if column is None else torch.empty_like(tau)  # (the sink's gradient per row)
        m, ms = _mask_args(mask, q)
        upper_grad = upper is not None and ctx.needs_input_grad[4]
        # (the bounds' gradient: 0 where a block holds no weight, which the kernel skips)
        du = torch.zeros(B * H, L, S, dtype=torch.float32, device=q.device) if upper_grad else c
        bounds, us = _bounds_args(upper, q)
        ceiling = tau if upper is None else ctx.ceiling
        flags = dict(HAS_MASK=mask is not None, MASK_BOOL=mask is None or mask.dtype == torch.bool,
                     CAUSAL=causal or window > 0, WINDOW=window, SOFTCAP=cap, SET=_set(upper, column, nosum),
                     BLOCK_M=block, BLOCK_N=block, BLOCK_E=be, BLOCK_EV=bev,
                     UPCAST=not q.is_cuda, MAP=fns, **_options(q))
        common = (H, L, S, E, EV, float(scale))
        strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *ms, *us)
        kt = _kernels(backward=True)
        kt.attention_backward_rows[(nq, B * H)](q, k, v, do, dq, tau, fsum, c, support, m, params, u, wsum, bounds,
                                                 ceiling, du, tau if column is None else column, dcolumn, *common, nk,
                                                 params.shape[1], *strides, UPPER_GRAD=upper_grad, **flags)
        kt.attention_backward_keys[(nk, B * H)](q, k, v, do, dk, dv, tau, fsum, c, support, m, params, bounds,
                                                 ceiling, *common, nk, nq, params.shape[1], *strides, **flags)
        shape = (B, H)
        return (dq.reshape(shape + (L, E)).to(q.dtype), dk.reshape(shape + (S, E)).to(q.dtype),
                dv.reshape(shape + (S, EV)).to(q.dtype), None,
                du.reshape(shape + (L, S)) if upper_grad else None, None, None, None, None, None, None, None,
                None if column is None else dcolumn, None)


def _set(upper, column, nosum: bool) -> str:
    """The kernels' ``SET``: the box with bounds, one more column per row, no sum, else the simplex."""
    return "box" if upper is not None else "column" if column is not None else "nosum" if nosum else "simplex"


def _ceiling(module, params):
    """``omega'(inf)`` per batch and head where ``omega'`` is bounded, else ``inf`` (float32, ``(B * H,)``): the
    bounded kernels' ``Ceiling`` (:func:`numeric.constraints.box.box_ceiling` on the parameters' values)."""
    from numeric.constraints.box import box_ceiling
    from numeric.core.ops import Routines

    from ._ops import ops_for
    from .maps import routine_table

    values = tuple(params[:, i:i + 1] for i in range(len(module.PARAMETERS)))
    r = Routines(module, routine_table(module), values)
    like = torch.zeros(params.shape[0], 1, dtype=torch.float32, device=params.device)
    return box_ceiling(ops_for(torch.float32), r, like).reshape(-1).contiguous()


def _kernels(backward: bool = False):
    """:mod:`numeric.kernels.triton_attention`, or with ``backward`` :mod:`numeric.kernels.triton_backward` (imported
    on first use: they import Triton)."""
    if backward:
        from numeric.kernels import triton_backward

        return triton_backward
    from numeric.kernels import triton_attention

    return triton_attention


def _options(q) -> dict:
    """Compiler options of a launch on CUDA (contracted multiply-adds: one rounding instead of two; stated, so
    that Triton does not warn about its changing default); none in the interpreter."""
    return {"enable_fp_fusion": True} if q.is_cuda else {}


def _mask_args(mask, q):
    """The mask as the kernels read it (bool as uint8, the same memory) and its four strides."""
    if mask is None:
        return q, (0, 0, 0, 0)
    m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    return m, tuple(m.stride())


def _bounds_args(upper, q):
    """The bounds as the kernels read them and their four strides: ``q`` and zeros where there are none (the
    simplex: a placeholder the kernels do not read)."""
    if upper is None:
        return q, (0, 0, 0, 0)
    return upper, tuple(upper.stride())


def fused_attention(query, key, value, attn_mask, is_causal: bool, scale: float, fn, batch: tuple, upper=None,
                    window=None, softcap=None, column=None, nosum=False):
    """``fn(scale q k^T + mask) v`` through the map's Triton kernels (:func:`unsupported` returned ``None``);
    ``upper``: ``None``, a number or a tensor broadcasting to the scores, checked (:func:`check_bounds`): the map
    over the box ``0 <= p <= upper``; ``window``: a sliding window (the kernels skip the key blocks before it);
    ``softcap``: a :class:`numeric.modifiers.Softcap` (or ``None``), the kernels' ``SOFTCAP``; ``column``: one more
    score per row without a value (a sink, :mod:`numeric.constraints.sink`), a number or a tensor broadcasting to the
    scores with size 1 along the keys (its gradient flows), the kernels' ``SET='column'``;
    ``nosum``: no sum and no bound, ``SET='nosum'``."""
    L, S, E, EV = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    q, k, v = (_heads(t, batch, t.shape[-2], t.shape[-1]) for t in (query, key, value))
    B, H = q.shape[0], q.shape[1]
    mask = None if attn_mask is None else _heads(attn_mask, batch, L, S)
    if upper is not None:
        # float32, as the kernels compute (a tensor's gradient flows back through the conversion and the expansion)
        upper = (torch.full((), float(upper), dtype=torch.float32, device=query.device) if not
                 isinstance(upper, torch.Tensor) else upper.to(torch.float32))
        upper = _heads(upper, batch, L, S)
    if column is not None:  # (float32, one per (batch x head, row); a tensor's gradient flows back)
        column = (torch.full((), float(column), dtype=torch.float32, device=query.device) if not
                  isinstance(column, torch.Tensor) else column.to(torch.float32))
        column = _heads(column, batch, L, 1).reshape(-1, L).contiguous()
    params = _param_values(fn, batch, B, H, query.device)
    module = _case(fn)
    fns = map_functions(module)
    scores = (0 if window is None else int(window), 0.0 if softcap is None else float(softcap.cap))
    out = _Fused.apply(q, k, v, mask, upper, scale, is_causal, module, fns, params, (B, H, L, S, E, EV), scores,
                       column, nosum)
    return out.reshape(batch + (L, EV))


def unsupported_set(cset, values: dict) -> str | None:
    """Why the fused kernels cannot run the constraint set ``cset`` with its keywords' ``values``
    (:mod:`numeric.constraints`), or ``None``: they run the sets whose hook
    (:attr:`~numeric.constraints.ConstraintSet.fused`) they know (:data:`numeric.kernels.triton_attention.SETS`:
    the simplex, the box with a total of 1, one more column per row (a sink), no sum without a bound)."""
    if cset.fused not in ("simplex", "box", "column", "nosum"):
        return f"the fused kernels do not run the {cset.name} constraint set"
    if cset.fused == "nosum" and values["upper"] is not None and not left_out(values["upper"], math.inf):
        return "the fused kernels run maps without a sum unbounded only"
    if cset.fused == "box" and not left_out(values["total"], 1.0):
        return "the fused kernels bound the weights with a total of 1 only"
    return None


def set_arguments(cset, values: dict, attn_mask, is_causal: bool, scores: tuple, dtype, window=None) -> dict:
    """The fused kernels' keyword arguments for a constrained call the kernels run (:func:`unsupported_set`),
    the set's own (:meth:`~numeric.constraints.ConstraintSet.fused_arguments`), the box's bounds checked as the map
    checks them first."""
    hook = cset.fused_arguments(values)
    if "upper" in hook:
        check_bounds(hook["upper"], attn_mask, is_causal, scores, dtype, window)
    return hook


def check_bounds(upper, attn_mask, is_causal: bool, scores: tuple, dtype, window=None) -> None:
    """The checks the bounded map makes (:func:`numeric.constraints.box.box_rows`: bounds ``>= 0``, and those of each
    query's keys, the mask's and with ``is_causal`` ``j <= i`` (with a ``window`` also ``i - j < window``), summing
    to at least 1), made before the kernels run; raises as the map does."""
    from ..constraints.box import box_rows
    from .maps import ARRAYS

    L, S = scores[-2:]
    device = upper.device if isinstance(upper, torch.Tensor) else getattr(attn_mask, "device", None)
    keep = torch.ones(scores, dtype=torch.bool, device=device)
    if attn_mask is not None:
        keep = keep & (attn_mask if attn_mask.dtype == torch.bool else attn_mask != float("-inf"))
    if is_causal or window is not None:
        keep = keep & torch.ones(L, S, dtype=torch.bool, device=device).tril()
    if window is not None:
        keep = keep & ~torch.ones(L, S, dtype=torch.bool, device=device).tril(-window)
    x = torch.zeros(scores, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    box_rows(torch, ARRAYS, x, upper.detach() if isinstance(upper, torch.Tensor) else upper, 1.0, -1, "dim")


def case_groups(fn, batch: tuple):
    """``[(heads, map)]`` for a family map whose parameter holds one value per head (the head axis last in the
    batch) in several of its cases, or values at a point case (softmax at alpha = 1): the heads of each case (an
    index tensor) and the map that runs them, a point case's own module (no parameters) or the family with those
    heads' values (their case's kernels); ``None`` where the values are not of that form, cannot be read, or lie
    in one open case (the map runs as it is)."""
    module = fn.module
    if not family.is_family(module) or not batch or torch.compiler.is_compiling():
        return None
    value = fn.params.get(module.FAMILY_PARAMETER)
    H = batch[-1]
    if isinstance(value, torch.Tensor):
        shape = (1,) * max(0, len(batch) + 2 - value.dim()) + tuple(value.shape)
        if value.numel() == 1:
            heads = np.full(H, float(value.detach().reshape(())))
        elif len(shape) < 3 or shape[-3] != H or any(n != 1 for i, n in enumerate(shape) if i != len(shape) - 3):
            return None
        else:
            heads = value.detach().reshape(H).cpu().double().numpy()
    else:
        shape, heads = None, np.full(H, float(value))
    cases = [family.case_index(module.CASES, float(a)) for a in heads]
    point = [c is not None and module.CASES[c][0] == module.CASES[c][1] for c in cases]
    if any(c is None for c in cases) or len(set(cases)) < 2 and not point[0]:
        return None
    groups = []
    for c in sorted(set(cases)):
        index = torch.tensor([h for h in range(H) if cases[h] == c], device=getattr(value, "device", None))
        lo, hi, _ = module.CASES[c]
        if lo == hi:  # a point: its own module, no parameter
            groups.append((index, type(fn)(family.case_modules(module)[c])))
        elif shape is None or value.numel() == 1:
            groups.append((index, fn))
        else:
            part = value.reshape(shape).index_select(len(shape) - 3, index.to(value.device))
            groups.append((index, type(fn)(fn, **{module.FAMILY_PARAMETER: part})))
    return groups


def grouped_attention(query, key, value, attn_mask, is_causal: bool, scale: float, groups, batch: tuple,
                      upper=None, window=None, softcap=None, column=None, nosum=False):
    """:func:`fused_attention` head group by head group (:func:`case_groups`), each with its case's kernels; the
    outputs put back in the heads' order."""
    H = batch[-1]

    def heads(t, index):
        if t is None:
            return None
        if t.dim() >= 3 and t.shape[-3] == H and len(batch) + 2 - t.dim() <= 0:
            return t.index_select(t.dim() - 3, index)
        return t  # (broadcast along the heads)

    outs, order = [], []
    for index, m in groups:
        part = batch[:-1] + (len(index),)
        outs.append(fused_attention(heads(query, index), heads(key, index), heads(value, index),
                                    heads(attn_mask, index), is_causal, scale, m, part,
                                    heads(upper, index) if isinstance(upper, torch.Tensor) else upper, window,
                                    softcap, heads(column, index) if isinstance(column, torch.Tensor) else column,
                                    nosum))
        order.append(index)
    out = torch.cat(outs, dim=-3)
    inverse = torch.empty(H, dtype=torch.long, device=out.device)
    inverse[torch.cat(order)] = torch.arange(H, device=out.device)
    return out.index_select(out.dim() - 3, inverse)
