"""The generated-module contract: what every map module ``regattn generate`` writes provides.

This is its one definition.  The emitter (:mod:`derive.codegen.emit`) writes
these names and nothing else, stamps :data:`FORMAT_VERSION` into each module,
and sets the routines a map does not have to ``None``; the verifier
(:mod:`derive.codegen.verify`) checks every routine a module has against
SymPy; :class:`numeric.Map` and the loaders refuse a module that lacks a name
or was written for another format.

Routines take their own arguments (:attr:`Routine.args`) followed by the
map's parameters (``PARAMETERS``, e.g. ``alpha``), and are NumPy functions
(CuPy arrays pass through them too), and the same functions run on the arrays
of the :data:`FRAMEWORKS` (:func:`routines_on`: their code with ``numpy`` bound
to the framework's array namespace); ``CUDA_DEVICE_SOURCE`` holds each as a
``template <typename T> __device__`` function ``NAME_routine`` and the struct ``NAME_map<T>`` the
kernels of :mod:`numeric.kernels` take, and ``CUDA_SOURCE`` adds those kernels with the entry points
named in ``CUDA_KERNELS``, launched with :data:`CUDA_THREADS` threads per block; ``TRITON_SOURCE`` is a
Python module of the map's ``@triton.jit`` functions, which the fused attention kernels of
:mod:`numeric.kernels.triton_attention` call.

This module uses only the standard library: ``derive`` reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import FunctionType, ModuleType

__all__ = ["FORMAT_VERSION", "CUDA_THREADS", "Routine", "ROUTINES", "PER_PARAMETER", "CONSTANTS", "SOURCES",
           "FRAMEWORKS", "CONTINUOUS_NAMES", "routine_names", "required_names", "missing_names", "check_map_module",
           "check_continuous_module", "check_format", "namespace_as_numpy", "routines_on"]

#: Version of the contract, written into every generated module, a map (discrete or continuous) or package code
#: (``newton_link.py``, ``newton_link_triton.py``, ``rows_solve.py``), as ``FORMAT_VERSION`` and in its header
#: (``# format: N``); :func:`check_format` refuses a module of another.
FORMAT_VERSION = 8
#: Threads per block of every generated CUDA kernel.
CUDA_THREADS = 256


@dataclass(frozen=True)
class Routine:
    """One generated routine: its name, its arguments before the parameters, what it computes, when it exists."""

    name: str
    args: tuple[str, ...]
    doc: str
    present: str = "always"


#: The routines of a map module, in the order they are written.  ``present`` is ``"always"``,
#: ``"closed link"`` (``LINK_METHOD == "closed"``), ``"power link"`` (``LINK_FORM == "power"``),
#: ``"closed threshold"``, ``"sort threshold"`` or ``"quadratic sort threshold"``; a routine
#: that is not present is ``None`` in the module.
ROUTINES: tuple[Routine, ...] = (
    Routine("omega", ("p",), "omega(p), the regularizer's scalar function (p > 0)."),
    Routine("omega_prime", ("p",), "omega'(p); the link inverts it."),
    Routine("omega_second", ("p",), "omega''(p)."),
    Routine("omega_third", ("p",), "omega'''(p), for Halley's method on omega'(sum_i p_i) = omega'(1)."),
    Routine("weight", ("p",), "w(p) = 1/omega''(p) = g'(z): Jacobian diag(w) - w w^T / sum(w)."),
    Routine("weight_d2", ("p",), "w'(p) w(p) = g''(z) at p = g(z)."),
    Routine("clip", (), "omega'(0+): p = 0 where z = s - tau <= clip."),
    Routine("omega_zero", (), "omega(0+), the value of a coordinate off the support."),
    Routine("link", ("z",), "g(z) = (omega')^{-1}(z), the unclipped link.", "closed link"),
    Routine("link_dtau", ("z",), "d/dtau g(s - tau) = -g'(z).", "closed link"),
    Routine("link_dtau2", ("z",), "d^2/dtau^2 g(s - tau) = g''(z).", "closed link"),
    Routine("link_scale", (), "a in the link's form g(z) = (a (z - clip))**k.", "power link"),
    Routine("link_exponent", (), "k in the link's form g(z) = (a (z - clip))**k.", "power link"),
    Routine("term", ("s",), "B(s): g(s - tau) = A(tau) B(s).", "closed threshold"),
    Routine("tau_from_sum", ("S",), "tau as a function of S = sum_i B(s_i).", "closed threshold"),
    Routine("tau_candidate", ("k", "S_1", "S_2"),
            "tau_k from the k largest scores: S_1 their sum, S_2 the sum of their squares.", "sort threshold"),
    Routine("discriminant", ("k", "S_1", "S_2"), "tau_k is real where this is >= 0.", "quadratic sort threshold"),
)
#: One routine per parameter ``q``: ``omega_prime_d_q(p, *params)``.
PER_PARAMETER = Routine("omega_prime_d_{}", ("p",), "d omega'(p) / d {0}: dp*/d{0} = -J c with c_i = this at p_i.",
                        "per parameter")
#: The constants of a map module.  ``TERM_IS_EXP`` says whether a closed threshold's ``term`` is ``exp`` itself
#: (``False`` for the other thresholds): the NumPy solver then writes ``exp`` straight into its output.
CONSTANTS: tuple[str, ...] = (
    "NAME", "REGULARIZER", "SPARSE", "THRESHOLD", "THRESHOLD_DEGREE", "LINK_METHOD", "LINK_FORM", "TERM_IS_EXP",
    "PARAMETERS", "PARAMETER_DOMAINS", "FORMAT_VERSION", "CUDA_THREADS", "CUDA_KERNELS",
)
#: The kernel sources of a map module: CUDA C++ (assembled with the package's kernels when the module is imported),
#: and ``TRITON_SOURCE``, the text of a Python module of the map's Triton functions (:mod:`derive.codegen.triton`;
#: a link with no closed form is its inversion traced into Triton).
SOURCES: tuple[str, ...] = ("CUDA_DEVICE_SOURCE", "CUDA_SOURCE", "TRITON_SOURCE")
#: The array frameworks that run a map module's NumPy routines on their own arrays (:func:`routines_on`), each
#: an optional extra of regattn.
FRAMEWORKS: tuple[str, ...] = ("torch", "jax")


#: What a continuous map module (:mod:`derive.codegen.continuous`) defines that :class:`numeric.continuous.ContinuousMap`
#: reads.
CONTINUOUS_NAMES: tuple[str, ...] = ("NAME", "FAMILY", "FORMAT_VERSION", "CUDA_THREADS", "CUDA_KERNELS", "CUDA_SOURCE",
                                     "rbf_expectation_grad", "density", "support_radius")


def routine_names(parameters) -> tuple[str, ...]:
    """The routines of a map with these parameter names, in order: :data:`ROUTINES`, then one per parameter."""
    return tuple(r.name for r in ROUTINES) + tuple(PER_PARAMETER.name.format(q) for q in parameters)


def required_names() -> tuple[str, ...]:
    """Every name a map module defines (a routine that is not present is ``None``)."""
    return CONSTANTS + tuple(r.name for r in ROUTINES) + SOURCES


def missing_names(module: ModuleType) -> list[str]:
    """The names of the contract ``module`` lacks, its parameter routines included."""
    out = [name for name in required_names() if not hasattr(module, name)]
    for q in getattr(module, "PARAMETERS", ()):
        name = PER_PARAMETER.name.format(q)
        if not hasattr(module, name):
            out.append(name)
    return out


def check_format(module: ModuleType) -> ModuleType:
    """``module``, a generated module of any kind (a map, a continuous map, package code such as
    ``numeric._generated.rows_solve``), if it states this :data:`FORMAT_VERSION`; else ``TypeError`` saying to
    run ``regattn generate`` again (a module with none comes from a regattn before the format was stamped)."""
    label = getattr(module, "__name__", module)
    version = getattr(module, "FORMAT_VERSION", None)
    if version is None:
        raise TypeError(f"module {label!r} states no FORMAT_VERSION: it comes from an older regattn, this one reads "
                        f"format {FORMAT_VERSION}: run `regattn generate` again")
    if version != FORMAT_VERSION:
        raise TypeError(f"module {label!r} was generated for format {version!r}, this regattn reads "
                        f"format {FORMAT_VERSION}: run `regattn generate` again")
    return module


def check_map_module(module: ModuleType) -> None:
    """Raise ``TypeError`` naming what is wrong if ``module`` does not meet this contract."""
    label = getattr(module, "__name__", module)
    missing = missing_names(module)
    if missing:
        older = getattr(module, "FORMAT_VERSION", None) != FORMAT_VERSION
        hint = "; it may come from an older regattn: run `regattn generate` again" if older else ""
        raise TypeError(f"module {label!r} is not a generated map: missing {', '.join(missing)}{hint}")
    check_format(module)
    if module.CUDA_THREADS != CUDA_THREADS:
        raise TypeError(f"module {label!r} launches {module.CUDA_THREADS} threads per block, the contract says {CUDA_THREADS}")


def check_continuous_module(module: ModuleType) -> None:
    """Raise ``TypeError`` naming what is wrong if ``module`` is not a continuous map module of this format."""
    label = getattr(module, "__name__", module)
    missing = [name for name in CONTINUOUS_NAMES if not hasattr(module, name)]
    if missing:
        older = hasattr(module, "FAMILY") and getattr(module, "FORMAT_VERSION", None) != FORMAT_VERSION
        hint = "; it may come from an older regattn: run `regattn generate` again" if older else ""
        raise TypeError(f"{label!r} is not a generated continuous module: missing {', '.join(missing)}{hint}")
    check_format(module)


def namespace_as_numpy(name: str, library: ModuleType, **names) -> ModuleType:
    """A module ``name`` holding ``library``'s public names, with ``names`` in place of some: the ``numpy`` that
    :func:`routines_on` binds generated routines to (torch's functions under NumPy's names; NumPy with a faster
    ``where``).  A module object, which torch.compile reads as it reads torch itself."""
    namespace = ModuleType(name)
    namespace.__dict__.update((k, v) for k, v in vars(library).items() if not k.startswith("_"))
    namespace.__dict__.update(names)
    return namespace


def routines_on(module: ModuleType, namespace, **names) -> dict:
    """``{routine: function or None}`` for all of :func:`routine_names`: the module's NumPy routines with
    ``numpy`` bound to ``namespace`` and the other global names in ``names`` (``erf``) bound to their values.

    The generated routines call NumPy only through the name ``numpy`` (and ``erf``, ``math``), so a framework
    whose array namespace spells NumPy's functions runs the very code that was verified, on its arrays, with
    its autograd: one text for every framework.  A routine calling another finds the rebound one.
    """
    if getattr(module, "CASES", None) is not None:  # a family: numeric.family.table_on, which complete() bound to it
        return module.TABLE_ON(namespace, lambda m, own=False: _rebound(m, namespace, names, own))
    return _rebound(module, namespace, names)


def _rebound(module: ModuleType, namespace, names: dict, own: bool = False) -> dict:
    """:func:`routines_on` of one module; ``own``: every function the module defines (a family's limits)."""
    scope = dict(vars(module), numpy=namespace, **names)
    out = {}
    listed = ([n for n, f in vars(module).items() if isinstance(f, FunctionType) and f.__module__ == module.__name__]
              if own else routine_names(module.PARAMETERS))
    for name in listed:
        f = getattr(module, name)
        out[name] = None if f is None else FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
    scope.update((name, f) for name, f in out.items() if f is not None)
    return out


@lru_cache(maxsize=64)
def module_routines(module: ModuleType) -> dict:
    """``{routine: function or None}`` for all of :func:`routine_names`: the module's own NumPy routines (which take
    CuPy arrays too, through NumPy's dispatch) on :func:`_numpy` (``numpy.where`` without a branch per element), for
    :class:`numeric.core.ops.Routines`."""
    return routines_on(module, _numpy())


@lru_cache(maxsize=1)
def _numpy() -> ModuleType:
    """NumPy under its own names, with :func:`numeric.numpy.rows.where` for ``numpy.where`` (a printed select
    evaluates both branches, and ``np.where`` on a condition that mixes True and False at random runs at a tenth
    of the speed of the arithmetic around it)."""
    import numpy as np

    from .numpy.rows import where

    return namespace_as_numpy("numeric.numpy.as_numpy", np, where=where)
