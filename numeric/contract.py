"""The generated-module contract: what every map module ``regattn generate`` writes provides.

This is its one definition.  The emitter (:mod:`derive.codegen.emit`) writes
these names and nothing else, stamps :data:`FORMAT_VERSION` into each module,
and sets the routines a map does not have to ``None``; the verifier
(:mod:`derive.codegen.verify`) checks every routine a module has against
SymPy; :class:`numeric.Map` and the loaders refuse a module that lacks a name
or was written for another format.

Routines take their own arguments (:attr:`Routine.args`) followed by the
map's parameters (``PARAMETERS``, e.g. ``alpha``), and are NumPy functions
(CuPy arrays pass through them too); the functions named in :data:`SECTIONS`
return the same routines printed for PyTorch and JAX; ``CUDA_DEVICE_SOURCE`` holds each as a
``template <typename T> __device__`` function ``NAME_routine`` and the struct ``NAME_map<T>`` the
kernels of :mod:`numeric.kernels` take, and ``CUDA_SOURCE`` adds those kernels with the entry points
named in ``CUDA_KERNELS``, launched with :data:`CUDA_THREADS` threads per block; ``TRITON_SOURCE`` is a
Python module of the map's ``@triton.jit`` functions, which the fused attention kernels of
:mod:`numeric.kernels.triton_attention` call.

This module uses only the standard library: ``derive`` reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

__all__ = ["FORMAT_VERSION", "CUDA_THREADS", "Routine", "ROUTINES", "PER_PARAMETER", "CONSTANTS", "SOURCES",
           "SECTIONS", "CONTINUOUS_NAMES", "routine_names", "required_names", "missing_names", "check_map_module",
           "check_continuous_module"]

#: Version of the contract, written into every generated map module, discrete or continuous, as
#: ``FORMAT_VERSION`` (and in its header).
FORMAT_VERSION = 7
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
#: The array frameworks with a section in every map module: framework -> the module's function that imports
#: it and returns ``{routine: function or None}`` for all of :func:`routine_names`, printed for its arrays.
SECTIONS: dict[str, str] = {"torch": "torch_routines", "jax": "jax_routines"}


#: What a continuous map module (:mod:`derive.codegen.continuous`) defines that :class:`numeric.continuous.ContinuousMap`
#: reads.
CONTINUOUS_NAMES: tuple[str, ...] = ("NAME", "FAMILY", "FORMAT_VERSION", "CUDA_THREADS", "CUDA_KERNELS", "CUDA_SOURCE",
                                     "rbf_expectation_grad", "density", "support_radius")


def routine_names(parameters) -> tuple[str, ...]:
    """The routines of a map with these parameter names, in order: :data:`ROUTINES`, then one per parameter."""
    return tuple(r.name for r in ROUTINES) + tuple(PER_PARAMETER.name.format(q) for q in parameters)


def required_names() -> tuple[str, ...]:
    """Every name a map module defines (a routine that is not present is ``None``)."""
    return CONSTANTS + tuple(r.name for r in ROUTINES) + SOURCES + tuple(SECTIONS.values())


def missing_names(module: ModuleType) -> list[str]:
    """The names of the contract ``module`` lacks, its parameter routines included."""
    out = [name for name in required_names() if not hasattr(module, name)]
    for q in getattr(module, "PARAMETERS", ()):
        name = PER_PARAMETER.name.format(q)
        if not hasattr(module, name):
            out.append(name)
    return out


def check_map_module(module: ModuleType) -> None:
    """Raise ``TypeError`` naming what is wrong if ``module`` does not meet this contract."""
    label = getattr(module, "__name__", module)
    missing = missing_names(module)
    if missing:
        older = getattr(module, "FORMAT_VERSION", None) != FORMAT_VERSION
        hint = "; it may come from an older regattn: run `regattn generate` again" if older else ""
        raise TypeError(f"module {label!r} is not a generated map: missing {', '.join(missing)}{hint}")
    if module.FORMAT_VERSION != FORMAT_VERSION:
        raise TypeError(f"module {label!r} was generated for format {module.FORMAT_VERSION!r}, this regattn reads "
                        f"format {FORMAT_VERSION}: run `regattn generate` again")
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
    if module.FORMAT_VERSION != FORMAT_VERSION:
        raise TypeError(f"module {label!r} was generated for format {module.FORMAT_VERSION!r}, this regattn reads "
                        f"format {FORMAT_VERSION}: run `regattn generate` again")
