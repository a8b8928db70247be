"""The kernels of every map, written once: CUDA row kernels and Triton attention kernels.

A generated map module holds only what is derived from its regularizer: its
routines as ``template <typename T> __device__`` functions, a struct
``NAME_map<T>`` gathering those the kernels call, and one ``extern "C"`` entry
point per kernel and dtype that calls a template of this package with that
struct.  The module's ``CUDA_SOURCE`` is assembled here when it is imported:

    CUDA_DEVICE_SOURCE = device_source(functions)          # prelude.cuh + the map's functions
    CUDA_SOURCE = rows_source(CUDA_DEVICE_SOURCE, entries)  # + reductions.cuh, rows.cuh + the entry points

so a fix to a kernel is one edit of a file here, and every module compiles the
fixed kernel without being generated again.

* ``prelude.cuh``: float and double overloads of the math functions generated
  code calls (``rg_exp``, ``rg_log1p``...), ``rg_inf``, ``rg_eps``; after it
  ``rg_newton_link``, the inversion of a link with no closed form, which
  ``regattn generate`` traces from :func:`numeric.newton.invert_link`
  (``numeric/_generated/newton_link.py``, with its Triton twin);
* ``reductions.cuh``: block-wide sum and maximum (``rg_block_sum``, ``rg_block_max``);
* ``rows.cuh``: the row kernels of a discrete map (``rg_forward_rows``,
  ``rg_forward_from_tau``, ``rg_jvp``); the forward pass solves each row with
  ``rg_solve_row``, :func:`numeric.core.rules.solve` traced by ``regattn generate``
  (``numeric/_generated/rows_solve.py`` and its parts ``rows_solve_1.py``..., :mod:`derive.codegen.trace_rows`);
* ``context.cuh``: the context kernel of a continuous map (``rg_rbf_context``)
  and its Gauss-Legendre branch;
* :mod:`numeric.kernels.triton_attention`: the fused attention kernels, taking
  the map's ``@triton.jit`` functions (a module's ``TRITON_SOURCE``) and the
  constraint set (``SET``: ``"simplex"`` or ``"box"``) as ``tl.constexpr``
  arguments; :mod:`numeric.kernels.triton_box` holds the box's steps the
  kernels call, :mod:`numeric.kernels.triton_sort` the sorting network that
  keeps each row's largest scores.

This package imports neither CuPy nor Triton (the Triton kernels are a
submodule of their own).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["cuda_file", "device_source", "rows_source", "context_source"]


@cache
def cuda_file(name: str) -> str:
    """The text of the package's CUDA file ``name`` (``"prelude.cuh"``, ``"reductions.cuh"``, ``"rows.cuh"``,
    ``"context.cuh"``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def device_source(functions: str) -> str:
    """A map's ``CUDA_DEVICE_SOURCE``: the prelude, the inversion of a link with no closed form
    (``rg_newton_link``, generated: ``numeric/_generated/newton_link.py``), the enum of the traced row solves
    (``rg_solver``, generated: ``numeric/_generated/rows_solve.py``), then the map's device functions
    ``functions``."""
    return cuda_file("prelude.cuh") + _newton_link() + "\n" + _rows_solve().ENUM_SOURCE + "\n" + functions


@cache
def _newton_link() -> str:
    """``rg_newton_link``'s text, from the generated module, its header and format checked as a map's are."""
    from numeric import contract, trust

    return contract.check_format(trust.import_generated("numeric._generated.newton_link")).CUDA_SOURCE


def rows_source(device: str, entries: str) -> str:
    """A discrete map's ``CUDA_SOURCE``: its device source, the reductions, the traced row solves (generated:
    ``numeric/_generated/rows_solve.py``), the row kernels, then its entry points ``entries``."""
    return (device + "\n" + cuda_file("reductions.cuh") + "\n" + _rows_solve().CUDA_SOURCE + "\n" + cuda_file("rows.cuh")
            + "\n" + entries)


@cache
def _rows_solve():
    """The traced row solves: ``ENUM_SOURCE``, and ``CUDA_SOURCE``, the parts' texts (the modules the generated
    module's ``PARTS`` names) then its own; each module's header and format checked as a map's are."""
    from types import SimpleNamespace

    from numeric import contract, trust

    main = contract.check_format(trust.import_generated("numeric._generated.rows_solve"))
    parts = [contract.check_format(trust.import_generated(f"numeric._generated.{name}")).CUDA_SOURCE
             for name in main.PARTS]
    return SimpleNamespace(ENUM_SOURCE=main.ENUM_SOURCE, CUDA_SOURCE="".join(parts) + main.CUDA_SOURCE)


def context_source(device: str, entries: str) -> str:
    """A continuous map's ``CUDA_SOURCE``: its device source, the context kernel, then its entry points."""
    return device + "\n" + cuda_file("context.cuh") + "\n" + entries
