"""CUDA C++ for a derivation: the map's part of the source the kernels of :mod:`numeric.kernels` are built from.

The kernels themselves (``numeric/kernels/rows.cuh``) are package code, written
once; a generated module holds what is derived from its regularizer:

* one ``template <typename T> __device__`` function per routine (printed by
  :func:`derive.codegen.emit.generate_module`), and for a link with no closed form
  ``NAME_link`` (:func:`newton_link`): the package's ``rg_newton_link``
  (:func:`numeric.newton.invert_link` traced into C once, by
  :func:`derive.codegen.trace.newton_link_sources`) with the map's derivatives;
* :func:`map_struct`: ``NAME_map<T>``, the struct of the map's parameters and of
  the routines the kernels call, and ``NAME_link_plus`` (the clipped link);
* :func:`entry_points`: ``extern "C"`` kernels ``NAME_{forward_from_tau,
  forward_rows, jvp}_{f32,f64}`` calling the package's templates with the
  struct, launched with 256 threads per block.
"""

from __future__ import annotations

__all__ = ["newton_link", "map_struct", "entry_points", "kernel_names", "ROLES"]


def newton_link(name: str, params: list[str]) -> str:
    """The device function ``NAME_link(z, params...)`` for a link with no closed form: the package's
    ``rg_newton_link`` (``numeric/_generated/newton_link.py``) with the map's ``omega'`` and ``omega''``."""
    decl = "".join(f", T {q}" for q in params)
    call = "".join(f", {q}" for q in params)
    return "\n".join([
        "// g(z) = (omega')^{-1}(z): no closed form; numeric.newton.invert_link, traced (rg_newton_link)",
        f"template <typename T> __device__ __forceinline__ T {name}_link(T z{decl}) {{",
        f"    return rg_newton_link(z, [=](T q) {{ return {name}_omega_prime<T>(q{call}); }},",
        f"                          [=](T q) {{ return {name}_omega_second<T>(q{call}); }});",
        "}"])


#: The struct's methods (the routines of the kernels' interface) by routine, with their arguments.
_METHODS = {"clip": (), "link": ("z",), "link_dtau": ("z",), "omega": ("p",), "omega_prime": ("p",),
            "omega_second": ("p",), "omega_third": ("p",), "weight": ("p",), "weight_d2": ("p",), "term": ("s",),
            "tau_from_sum": ("S",), "tau_candidate": ("k", "S_1", "S_2"), "discriminant": ("k", "S_1", "S_2"),
            "link_scale": (), "link_exponent": ()}
#: The kernels of every discrete map, each an entry point per dtype: (role, pointer arguments).
ROLES = (("forward_from_tau", "const T* s, const T* tau, T* p"), ("forward_rows", "const T* s, T* p, T* tau"),
         ("jvp", "const T* p, const T* v, T* out"))


def map_struct(name: str, params: list[str], routines, solver: str) -> str:
    """``NAME_map<T>``: the map's parameters and the routines (of ``routines``) that the row kernels call, as the
    interface of ``numeric/kernels/rows.cuh``, and ``solver``, the ``rg_solver`` of the traced solve its rows take
    (:data:`derive.codegen.trace_rows.SOLVERS`); then ``NAME_link_plus(z, params...)``, the clipped link."""
    call = ", ".join(params)
    lines = [f"// the interface of the row kernels (numeric/kernels/rows.cuh) to {name}",
             f"template <typename T> struct {name}_map {{",
             f"    static constexpr rg_solver solver = {solver};"]
    if params:
        lines.append(f"    T {', '.join(params)};")
    for routine, args in _METHODS.items():
        if routine in routines:
            decl = ", ".join(f"T {a}" for a in args)
            pass_on = ", ".join(list(args) + list(params))
            lines.append(f"    __device__ T {routine}({decl}) const {{ return {name}_{routine}<T>({pass_on}); }}")
    lines.append("};")
    decl = "".join(f", T {q}" for q in params)
    lines.append(f"template <typename T> __device__ __forceinline__ T {name}_link_plus(T z{decl}) {{ "
                 f"return rg_link_plus({name}_map<T>{{{call}}}, z); }}")
    return "\n".join(lines)


def entry_points(name: str, params: list[str]) -> str:
    """The ``extern "C"`` kernels of a discrete map: per role of :data:`ROLES` and dtype, a call of the package's
    template ``rg_ROLE`` with the map's struct."""
    out = []
    for T, suffix in (("float", "f32"), ("double", "f64")):
        decl = "".join(f", {T} {q}" for q in params)
        for role, pointers in ROLES:
            args = ", ".join(a.split()[-1].lstrip("*") for a in pointers.split(", "))
            out += [f'extern "C" __global__ void {name}_{role}_{suffix}({pointers.replace("T*", T + "*")}, '
                    f"long long rows, long long cols{decl}) {{",
                    f"    rg_{role}({args}, rows, cols, {name}_map<{T}>{{{', '.join(params)}}});", "}"]
    return "\n".join(out)


def kernel_names(name: str) -> list[str]:
    return [f"{name}_{role}_{suffix}" for suffix in ("f32", "f64") for role, _ in ROLES]
