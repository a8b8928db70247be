"""Turn a :class:`~derive.derivation.Derivation` into the text of an importable module.

:func:`generate_module` writes, for a map called ``NAME``:

* constants ``NAME``, ``REGULARIZER`` (``omega(p)`` as text), ``SPARSE``,
  ``THRESHOLD`` (``"closed"``, ``"sort"`` or ``"root"``), ``THRESHOLD_DEGREE``,
  ``LINK_METHOD`` (``"closed"`` or ``"newton"``), ``LINK_FORM`` (``"exp"``,
  ``"power"`` or ``"general"``, see :mod:`derive._linkform`), ``TERM_IS_EXP``
  (whether a closed threshold's ``term`` is ``exp`` itself), ``PARAMETERS`` and
  ``PARAMETER_DOMAINS``;
* NumPy functions, each taking the parameters after its own arguments:
  ``omega``, ``omega_prime``, ``omega_second``, ``omega_third`` (in ``p``),
  ``omega_prime_d_<parameter>`` for each parameter, ``weight``
  (``w = 1/omega''``) and ``weight_d2`` (``w' w``: with ``w`` the derivatives of
  ``g(s - tau)`` in ``tau`` are ``-w(p)`` and ``w'(p) w(p)``, what Halley needs),
  ``clip`` (``omega'(0+)``) and ``omega_zero``; ``link``, ``link_dtau`` and
  ``link_dtau2`` in ``z`` when the link is printed in closed form (else
  ``link = None``: invert ``omega_prime`` numerically); ``link_scale`` and
  ``link_exponent`` (``a``, ``k`` of ``g = (a (z - clip))**k``) where
  ``LINK_FORM == "power"``, else ``None``; ``term`` and
  ``tau_from_sum`` for a closed threshold; ``tau_candidate`` and
  ``discriminant`` for a sort threshold.  They call NumPy only as ``numpy.NAME``
  (and ``erf``), so the torch and JAX maps run the same code on their arrays
  (:func:`numeric.contract.routines_on`);
* ``CUDA_DEVICE_SOURCE`` (the same functions as ``template <typename T> __device__``
  and the struct ``NAME_map<T>`` of :func:`derive.codegen.cuda.map_struct`) and
  ``CUDA_SOURCE``, which adds the package's row kernels (:mod:`numeric.kernels`)
  and the entry points :func:`derive.codegen.cuda.entry_points`, joined when the
  module is imported; ``CUDA_KERNELS`` names the entry points;
* ``TRITON_SOURCE``: the map's ``@triton.jit`` functions (:mod:`derive.codegen.triton`).

The text is deterministic: the same derivation gives the same bytes, headed
by the regularizer and a SHA-256 of everything below the header.
"""

from __future__ import annotations

import keyword

import sympy as sp

from numeric import trust, contract

from ..derivation import Derivation
from ..symbols import S, S1, S2, k, score
from ..errors import DerivationError
from ..regularizers import check_parameter_name, p, z
from . import cuda
from . import triton as triton_code
from .printers import CudaPrinter, PyPrinter, print_block
from .rewrite import POINTS, POSITIVE, Select, overflow_form, stable_form
from .trace_rows import solver_for

__all__ = ["generate_module", "generate_family_module", "family_case_name", "assemble", "check_name", "HEADER_MARK",
           "content_hash"]

# The header rule (mark, hash) is defined once, in numeric.trust, which checks
# every generated module before running it.
HEADER_MARK = trust.HEADER_MARK


def check_name(name: str) -> str:
    """``name`` if it is a valid, non-keyword Python identifier (it names a module and C symbols)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise DerivationError(f"map name {name!r} is not a Python identifier")
    if name.startswith("_"):
        raise DerivationError(f"map name {name!r} must not start with an underscore")
    return name


def content_hash(body: str) -> str:
    """``"sha256:"`` and the SHA-256 of ``body`` (UTF-8): :func:`numeric.trust.content_hash`."""
    return trust.content_hash(body)


class Piece:
    """One generated function: its name, arguments, expression and docstring.

    ``expr`` is the function's value (its docstring shows it); the code computes
    ``body`` after the assignments ``given`` (default: ``expr`` itself).
    """

    def __init__(self, name: str, args: list[str], expr: sp.Expr, doc: str, body: sp.Expr | None = None, given=(),
                 points=POINTS):
        self.name, self.args, self.expr, self.doc = name, args, expr, doc
        self.body = expr if body is None else body
        self.given = tuple(given)
        self.points = points  # where the routine is evaluated (rewrite.stable_form)


def evaluation_points(dv: Derivation) -> tuple:
    """Where ``dv``'s routines are evaluated, for :func:`~derive.codegen.rewrite.stable_form`: ``p`` near 0 and 1,
    and link arguments ``z`` near ``omega'(0+)`` where that is a finite number."""
    clip = dv.clip
    at_clip = ((z, (clip,)),) if clip.is_number and clip.is_finite else ()
    # parameters declared positive, whose sign the stable forms may use (rewrite.POSITIVE)
    positive = tuple((q.symbol, POSITIVE) for q in dv.parameters if bool(q.lower >= 0) and not q.symbol.is_positive)
    return ((p, (0, 1)),) + at_clip + positive


def _termwise(f, expr: sp.Expr) -> sp.Expr:
    """``f`` of each term of the sum ``expr``, each simplified on its own (one term: ``f(expr)`` simplified)."""
    return sp.Add(*(sp.simplify(f(t)) for t in sp.Add.make_args(expr)))


def map_pieces(dv: Derivation) -> list[Piece]:
    """The routines of :mod:`numeric.contract` that ``dv`` has, with their expressions."""
    th = dv.threshold
    w = dv.weight
    routines = {r.name: r for r in contract.ROUTINES}

    points = evaluation_points(dv)

    def piece(name, expr, body=None, given=(), doc=None):
        r = routines[name]
        return Piece(name, list(r.args), expr, doc or r.doc, body, given, points)

    # omega' (and its derivatives in the parameters) term by term where omega is a sum: SymPy's one fraction
    # would mix a Tsallis term's p**a - p, which cancels near a = 1 (rewrite._power_difference rewrites it on
    # its own), with the other terms
    omega_prime = _termwise(lambda t: sp.diff(t, p), dv.omega) if len(sp.Add.make_args(dv.omega)) > 1 else dv.omega_prime
    # where omega's domain ends at 1 its formula is undefined there ((1 - p) log(1 - p)): omega(1-) at p = 1
    at_one = None if dv.omega_one is None else Select(p - 1, dv.omega_one, stable_form(dv.omega, points))
    pieces = [
        piece("omega", dv.omega, body=at_one),
        piece("omega_prime", omega_prime),
        piece("omega_second", dv.omega_second),
        piece("omega_third", sp.simplify(sp.diff(dv.omega_second, p))),
        piece("weight", w),
        piece("weight_d2", th.d2link),
        piece("clip", dv.clip),
        piece("omega_zero", dv.omega_zero),
    ]
    per = contract.PER_PARAMETER
    for q in dv.parameters:
        name = q.symbol.name
        pieces.append(Piece(per.name.format(name), list(per.args), _termwise(lambda t: sp.diff(t, q.symbol), omega_prime),
                             per.doc.format(name), points=points))
    if dv.inversion.method == "closed":
        # Where SymPy's link cancels in floating point (stable_form rewrites it), its
        # derivatives in z inherit the cancellation: they are computed in p = g(z)
        # instead, as -w(p) and w'(p) w(p), whose condition numbers multiply to theirs.
        stable = stable_form(dv.link, points)
        in_p = stable != dv.link and stable != overflow_form(dv.link)
        given = [(p, dv.link)] if in_p else []
        in_p_doc = lambda name, tail: routines[name].doc.rstrip(".") + tail if in_p else None  # noqa: E731
        pieces += [
            piece("link", dv.link),
            piece("link_dtau", -th.dlink_z, body=-w if in_p else None, given=given,
                  doc=in_p_doc("link_dtau", " = -w(p), p = g(z).")),
            piece("link_dtau2", th.d2link_z, body=th.d2link if in_p else None, given=given,
                  doc=in_p_doc("link_dtau2", " = w'(p) w(p), p = g(z).")),
        ]
    form = dv.inversion.form
    if form.form == "power":
        pieces += [piece("link_scale", form.scale), piece("link_exponent", form.exponent)]
    if th.kind == "closed":
        pieces += [piece("term", th.term.subs(score, sp.Symbol("s", real=True))), piece("tau_from_sum", th.solution)]
    if th.kind == "sort":
        pieces.append(piece("tau_candidate", th.candidate))
        if th.discriminant is not None:
            pieces.append(piece("discriminant", th.discriminant))
    # a parameter declared positive is printed as a positive symbol of its name, so that the stable forms may use
    # its sign (rewrite._power_difference: a p**a - p = p expm1(log(a) + (a - 1) log(p)) needs a > 0)
    positive = {q.symbol: sp.Symbol(q.symbol.name, positive=True) for q in dv.parameters
                if bool(q.lower >= 0) and not q.symbol.is_positive}
    for pc in pieces if positive else ():
        pc.expr, pc.body = pc.expr.xreplace(positive), pc.body.xreplace(positive)
        pc.given = tuple((lhs, rhs.xreplace(positive)) for lhs, rhs in pc.given)
    return pieces


def symbols_for(args: list[str]) -> dict[str, sp.Symbol]:
    from .. import continuous as cont

    table = {"p": p, "z": z, "s": sp.Symbol("s", real=True), "S": S, "k": k, "S_1": S1, "S_2": S2,
             "t": cont.t, "mu": cont.mu, "sigma2": cont.sigma2, "c": cont.c, "s2": cont.s2,
             "theta_1": cont.theta1, "theta_2": cont.theta2}
    return {a: table[a] for a in args}


def python_function(piece: Piece, params: list[str], printer: PyPrinter) -> str:
    args = piece.args + params
    assigns, (result,) = print_block(printer, [piece.body], f"{piece.name}(...) = {piece.expr}", given=piece.given,
                                  points=piece.points)
    lines = [f"def {piece.name}({', '.join(args)}):",
             f'    """{piece.doc}', "", f"    {piece.name} = {sp.sstr(piece.expr)}", '    """']
    lines += [f"    {lhs} = {rhs}" for lhs, rhs in assigns]
    expr = piece.expr
    if expr.is_number:
        result = printer._print(sp.Float(expr.evalf(30), 30)) if expr.is_finite else result
    if piece.args and not expr.has(symbols_for(piece.args)[piece.args[0]]):
        # keep the shape and dtype of the argument (CuPy arrays dispatch zeros_like too)
        arg = piece.args[0]
        result = f"{printer._call('zeros_like')}({arg}) + {result}" if not expr.is_number else f"{printer._call('full_like')}({arg}, {result})"
    lines.append(f"    return {result}")
    return "\n".join(lines)


def cuda_function(piece: Piece, params: list[str], printer: CudaPrinter, name: str) -> str:
    args = [f"T {a}" for a in piece.args + params]
    assigns, (result,) = print_block(printer, [piece.body], f"{piece.name}(...) = {piece.expr}", given=piece.given,
                                  points=piece.points)
    body = [f"    const T {lhs} = {rhs};" for lhs, rhs in assigns]
    body.append(f"    return {result};")
    head = f"template <typename T> __device__ __forceinline__ T {name}_{piece.name}({', '.join(args)}) {{"
    return "\n".join([f"// {piece.doc}", head] + body + ["}"])


def module_imports(body: str) -> list[str]:
    """The import lines a generated module's text needs: math and erf only where used."""
    lines = ["import math", ""] if "math." in body else []
    lines.append("import numpy")
    lines.append("from numeric import kernels")
    if "erf(" in body:
        lines.append("from numeric.special import erf  # NumPy has no erf ufunc")
    return lines + [""]


def _domain(value: sp.Expr) -> str:
    if value == sp.oo:
        return "math.inf"
    if value == -sp.oo:
        return "-math.inf"
    return repr(float(value))


def generate_module(dv: Derivation, name: str) -> str:
    """The text of an importable Python module holding ``dv``'s NumPy functions and CUDA source.

    Parameters
    ----------
    dv:
        A derivation from :func:`~derive.argmax.derive_map`.
    name:
        The map's name: a Python identifier, used as ``NAME`` and as the prefix
        of every CUDA symbol.

    Raises
    ------
    DerivationError
        If ``name`` is not an identifier, or an expression the module needs
        cannot be printed (a function with no C99/NumPy counterpart).
    """
    if not isinstance(dv, Derivation):
        raise DerivationError(f"generate_module expects a Derivation, got {type(dv).__name__}")
    check_name(name)
    params = [q.symbol.name for q in dv.parameters]
    for q in params:  # (a Parameter checked its name; a Derivation built by hand may hold any symbol)
        check_parameter_name(q)
    pieces = map_pieces(dv)
    py, cu = PyPrinter(), CudaPrinter()

    device = [cuda_function(piece, params, cu, name) for piece in pieces]
    if dv.inversion.method != "closed":
        device.append(cuda.newton_link(name, params))
    form = dv.inversion.form
    exponent = None if form.exponent is None else sp.sympify(form.exponent)
    exponent = exponent if exponent is not None and exponent.is_number else None
    solver = solver_for(dv.threshold.kind, dv.threshold.degree, dv.inversion.method, form.form,
                        None if exponent is None else float(exponent), dv.clip == sp.S.NegativeInfinity)
    device.append(cuda.map_struct(name, params, {pc.name for pc in pieces} | {"link"}, solver.enum))
    device_source = "\n".join(device) + "\n"
    kernels = cuda.kernel_names(name)

    th = dv.threshold
    reg_text = sp.sstr(dv.omega)
    doc = [
        f'"""The {name} map, generated from omega(p) = {reg_text}.',
        "",
        f"Regularizer: {dv.name}; link: {dv.inversion.method} ({dv.inversion.reason});",
        f"threshold: {th.kind}; {'sparse' if dv.sparse else 'dense'}.",
        "The NumPy functions take their parameters after their own arguments;",
        "CUDA_SOURCE compiles with NVRTC on its own (kernels launched with",
        f"{contract.CUDA_THREADS} threads per block).  The contract: numeric.contract.",
        '"""',
    ]
    body = [
        f"NAME = {name!r}",
        f"REGULARIZER = {reg_text!r}",
        f"SPARSE = {dv.sparse!r}",
        f"THRESHOLD = {th.kind!r}",
        f"THRESHOLD_DEGREE = {th.degree!r}",
        f"LINK_METHOD = {dv.inversion.method!r}",
        f"LINK_FORM = {dv.inversion.form.form!r}",
        f"TERM_IS_EXP = {th.term_is_exp!r}",
        f"PARAMETERS = {tuple(params)!r}",
        "PARAMETER_DOMAINS = {" + ", ".join(
            f"{q.symbol.name!r}: ({_domain(q.lower)}, {_domain(q.upper)})" for q in dv.parameters
        ) + "}",
        f"FORMAT_VERSION = {contract.FORMAT_VERSION}",
        f"CUDA_THREADS = {contract.CUDA_THREADS}",
        f"CUDA_KERNELS = {tuple(kernels)!r}",
        "",
    ]
    for piece in pieces:
        body += ["", python_function(piece, params, py), ""]
    absent = [r.name for r in contract.ROUTINES if r.name not in {pc.name for pc in pieces}]
    if absent:  # the contract's routines this map does not have
        why = "  # no printable closed form: solve omega_prime(p) = z numerically" if "link" in absent else ""
        body += ["", " = ".join(absent) + " = None" + why, ""]
    by_name = {pc.name: pc for pc in pieces}
    triton_text = triton_code.triton_source(
        {n: (by_name[n].args, by_name[n].body, symbols_for(by_name[n].args)[by_name[n].args[0]] if by_name[n].args
             else None) for n in triton_code.PIECES if n in by_name}, params, evaluation_points(dv))
    body += ["", "#: this map's functions for the Triton attention kernels (derive.codegen.triton)",
             'TRITON_SOURCE = r"""', triton_text.rstrip("\n"), '"""', ""]
    return assemble(doc, body, device_source, cuda.entry_points(name, params), "rows_source",
                    [f"map: {name}", f"regularizer: omega(p) = {reg_text}", f"format: {contract.FORMAT_VERSION}"])


def assemble(doc: list[str], body: list[str], device_source: str, entries: str, assembler: str,
             header: list[str]) -> str:
    """A generated module's text: header comments, docstring, imports, ``body``, then the CUDA sources.

    ``device_source`` is the map's device functions, ``entries`` its ``extern "C"`` kernels; the module joins
    them with the package's kernels when it is imported (:mod:`numeric.kernels`: ``device_source`` and
    ``assembler``, ``"rows_source"`` or ``"context_source"``).  The header ends with a content hash of
    everything below it; runs of blank lines are cut to two, so the text is deterministic and ruff-clean.
    """
    body = ["", "\n".join(doc), ""] + module_imports("\n".join(body)) + body
    body += ["", "#: this map's device functions after the prelude (numeric/kernels/prelude.cuh)",
             'CUDA_DEVICE_SOURCE = kernels.device_source(r"""', device_source.rstrip("\n"), '""")', ""]
    body += ["#: everything CuPy compiles: the device source, the package's kernels and this map's entry points",
             f'CUDA_SOURCE = kernels.{assembler}(CUDA_DEVICE_SOURCE, r"""', entries.rstrip("\n"), '""")', ""]
    text = "\n".join(body)
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    text = text.strip("\n") + "\n"
    lines = [HEADER_MARK] + [f"# {line}" for line in header] + [f"# content-hash: {content_hash(text)}"]
    return "\n".join(lines) + "\n" + text


def family_case_name(name: str, index: int) -> str:
    """The module name of case ``index`` of the family module ``name`` (where its caller names none)."""
    return f"{name}_case{index}"


def generate_family_module(family, name: str, case_names: tuple[str, ...], derivations: tuple) -> str:
    """The text of a family's module: the cases of :func:`derive.family.derive_family` by parameter interval and
    the names of their modules (``case_names``, in the same package), and at each point case the limits of
    ``d omega'/dq`` and ``d omega/dq`` as NumPy functions of ``p`` (``omega_prime_d_<q>_case<i>``,
    ``omega_d_<q>_case<i>``).

    Importing it calls :func:`numeric.family.complete`, which imports the case modules and defines the contract's
    routines as the cases' routines picked by the parameter's value (:mod:`numeric.family`).  ``derivations``: the
    cases' :class:`~derive.derivation.Derivation` (for the constants every case shares).
    """
    check_name(name)
    for case_name in case_names:
        check_name(case_name)
    q = family.parameter
    params = [o.symbol.name for o in family.regularizer.parameters]
    py = PyPrinter()
    reg_text = sp.sstr(family.regularizer.omega)
    closed = all(dv.inversion.method == "closed" for dv in derivations)
    cases = "(" + ", ".join(f"({_domain(c.lower)}, {_domain(c.upper)}, {n!r})" for c, n in zip(family.cases, case_names)) + ",)"
    doc = [
        f'"""The {name} family, generated from omega(p) = {reg_text}.',
        "",
        f"Its map changes kind in {q.symbol}: cases {family.describe()}, each a module of its own",
        f"({', '.join(case_names)}).  numeric.family picks the case of each value of {q.symbol};",
        "its routines (defined on import by numeric.family.complete) are the cases' routines picked",
        "so.  The contract: numeric.contract.",
        '"""',
    ]
    body = [
        f"NAME = {name!r}",
        f"REGULARIZER = {reg_text!r}",
        f"FAMILY_PARAMETER = {q.symbol.name!r}",
        f"CASES = {cases}",
        "SPARSE = None",
        "THRESHOLD = 'root'",
        "THRESHOLD_DEGREE = None",
        f"LINK_METHOD = {'closed' if closed else 'newton'!r}",
        "LINK_FORM = 'general'",
        "TERM_IS_EXP = False",
        f"PARAMETERS = {tuple(params)!r}",
        "PARAMETER_DOMAINS = {" + ", ".join(
            f"{o.symbol.name!r}: ({_domain(o.lower)}, {_domain(o.upper)})" for o in family.regularizer.parameters
        ) + "}",
        f"FORMAT_VERSION = {contract.FORMAT_VERSION}",
        f"CUDA_THREADS = {contract.CUDA_THREADS}",
        "CUDA_KERNELS = ()",
        "",
    ]
    others = [o for o in params if o != q.symbol.name]
    for index, (d_prime, d_omega) in sorted(family.derivatives.items()):
        at = f"at {q.symbol} = {family.cases[index].lower}"
        for fname, expr, what in ((f"omega_prime_d_{q.symbol}_case{index}", d_prime, "d omega'(p) / d"),
                                  (f"omega_d_{q.symbol}_case{index}", d_omega, "d omega(p) / d")):
            piece = Piece(fname, ["p"], expr, f"lim {what} {q.symbol} {at}, the first-order term of the point case.")
            body += ["", python_function(piece, others, py), ""]
    body += ["", "#: no kernels of its own: a family runs the kernels of the case its values lie in",
             "CUDA_DEVICE_SOURCE = CUDA_SOURCE = TRITON_SOURCE = None", "",
             "from numeric import family as _family  # noqa: E402", "", "_family.complete(globals())", ""]
    imports = ["import math", ""] + (["import numpy", ""] if "numpy." in "\n".join(body) else [])
    body = ["", "\n".join(doc), ""] + imports + body
    text = "\n".join(body)
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    text = text.strip("\n") + "\n"
    header = [f"map: {name}", f"regularizer: omega(p) = {reg_text}", f"format: {contract.FORMAT_VERSION}"]
    lines = [HEADER_MARK] + [f"# {line}" for line in header] + [f"# content-hash: {content_hash(text)}"]
    return "\n".join(lines) + "\n" + text
