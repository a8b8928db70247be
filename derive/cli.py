"""The ``regattn`` command.

    regattn derive REG [--alpha 3/2] | --expr "EXPR" [--param NAME[:LOWER:UPPER]]... [--latex]
    regattn generate [--check] [--out DIR] [--force]   built-ins -> numeric/_generated/ (or DIR)
    regattn generate --expr "EXPR" --name NAME --out DIR [--param ...] [--force]
    regattn verify REG [--alpha 3/2] | --expr "EXPR" [--param ...] [--samples N]
    regattn --version

``REG`` is a regularizer (shannon, gini, tsallis) or the name of its map
(softmax, sparsemax, entmax15, entmax).  ``derive`` prints the derivation
(pretty text, or LaTeX with ``--latex``).  ``verify`` derives the map and
checks the high-precision reference on random score vectors against the KKT
conditions, the generated functions against SymPy, and the map
``numeric.get_map`` builds, printing one line per check and a verdict naming
what failed; it is the main job of the README.  Bad input, and any other
error (a full disk, an unwritable folder), prints one line
``regattn: error: ...`` and exits with status 2; ``--debug`` (or
``REGATTN_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import mpmath
import sympy as sp

from .argmax import derive_map
from .errors import DerivationError
from .reference import kkt_residual
from .regularizers import Parameter, Regularizer, gini, shannon, tsallis

__all__ = ["main", "regularizer_from_args", "parameter_from_text"]

_BUILTINS = ("shannon", "gini", "tsallis")
#: map name -> the regularizer it comes from (and Tsallis' alpha where fixed)
_MAP_NAMES = {"softmax": ("shannon", None), "sparsemax": ("gini", None), "entmax15": ("tsallis", "3/2"),
              "entmax": ("tsallis", None)}
#: options whose value may start with "-" (an expression such as -log(p), a negative bound)
_VALUE_OPTIONS = ("--expr", "--param", "--alpha")
_RESERVED_PARAMETER_NAMES = {"p", "pi", "E", "oo"}


def _add_regularizer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("regularizer", nargs="?", choices=_BUILTINS + tuple(_MAP_NAMES),
                        help="a built-in regularizer, or the name of its map")
    parser.add_argument("--alpha", help="Tsallis alpha, e.g. 3/2 or 1.5 (omit for symbolic alpha > 1)")
    _add_expr_arguments(parser)
    parser.add_argument("--name", default=None, help="label for a --expr regularizer")


def _add_expr_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--expr", help='a user regularizer omega(p), e.g. "p*log(p) + p**2/2" or "-log(p)"')
    parser.add_argument("--param", action="append", default=[], metavar="NAME[:LOWER:UPPER]",
                        help="declare a parameter of --expr, real on (LOWER, UPPER) (default the whole line), "
                             'e.g. --param c or --param "c:0:1"; repeat for several')


def parameter_from_text(text: str) -> Parameter:
    """A :class:`Parameter` from ``NAME``, ``NAME:LOWER``, ``NAME:LOWER:UPPER`` (bounds: numbers, ``oo``, ``-oo``)."""
    name, *bounds = [part.strip() for part in text.split(":")]
    if not name.isidentifier() or not name.isascii() or name in _RESERVED_PARAMETER_NAMES:
        raise DerivationError(f"--param {text!r}: {name!r} is not a usable parameter name")
    if len(bounds) > 2:
        raise DerivationError(f"--param {text!r}: expected NAME, NAME:LOWER or NAME:LOWER:UPPER")
    values = []
    for bound, default in zip(bounds + [""] * (2 - len(bounds)), (sp.S.NegativeInfinity, sp.S.Infinity)):
        if bound == "":
            values.append(default)
        elif bound.lstrip("+-") in ("oo", "inf"):
            values.append(sp.S.NegativeInfinity if bound.startswith("-") else sp.S.Infinity)
        else:
            try:
                values.append(sp.Rational(bound))
            except (TypeError, ValueError):
                raise DerivationError(f"--param {text!r}: bound {bound!r} is not a number such as 0, 1/2, 1.5 or oo") from None
    return Parameter(sp.Symbol(name), values[0], values[1])


def regularizer_from_args(args: argparse.Namespace) -> Regularizer:
    """The regularizer named by ``regularizer``/``--alpha``/``--expr``/``--param``."""
    names = ", ".join(_BUILTINS + tuple(_MAP_NAMES))
    if (args.regularizer is None) == (args.expr is None):
        raise DerivationError(f"give exactly one of a built-in ({names}) or --expr")
    params = getattr(args, "param", None) or []
    if params and args.expr is None:
        raise DerivationError("--param applies to --expr only")
    regularizer, alpha = args.regularizer, args.alpha
    if regularizer in _MAP_NAMES:
        regularizer, fixed = _MAP_NAMES[regularizer]
        if fixed is not None and alpha is not None:
            raise DerivationError(f"{args.regularizer} has alpha = {fixed}; --alpha applies to tsallis only (and to its map, entmax)")
        alpha = fixed if fixed is not None else alpha
    if args.alpha is not None and regularizer != "tsallis":
        raise DerivationError("--alpha applies to tsallis only (and to its map, entmax)")
    if args.expr is not None:
        parameters = tuple(parameter_from_text(text) for text in params)
        seen = [q.symbol.name for q in parameters]
        if len(set(seen)) != len(seen):
            raise DerivationError(f"--param declares a name twice: {', '.join(seen)}")
        return Regularizer.from_string(args.expr, name=args.name or "custom", parameters=parameters)
    if regularizer == "shannon":
        return shannon()
    if regularizer == "gini":
        return gini()
    if alpha is None:
        return tsallis()
    try:
        value = sp.Rational(alpha)
    except (TypeError, ValueError):
        raise DerivationError(f"--alpha must be a number such as 3/2 or 1.5, got {alpha!r}") from None
    return tsallis(value)


def _cmd_derive(args: argparse.Namespace) -> int:
    reg = regularizer_from_args(args)
    if args.continuous:
        from .continuous import derive_continuous

        dv = derive_continuous(reg)
    else:
        dv = derive_map(reg)
    sys.stdout.write(dv.latex() + "\n" if args.latex else dv.pretty())
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from .codegen import files

    if args.expr is not None or args.name is not None or args.param:
        if args.expr is None or args.name is None or args.out is None:
            raise DerivationError("a user map needs all of --expr, --name and --out")
        if args.check:
            raise DerivationError("--check applies to the built-ins only")
        files.check_module_name(args.name)
        reg = regularizer_from_args(argparse.Namespace(regularizer=None, alpha=None, expr=args.expr,
                                                       param=args.param, name=args.name))
        path = files.write_user_module(reg, args.name, args.out, force=args.force)
        print(f"wrote {path}")
        return 0
    folder = args.out
    if args.check:
        diffs = files.stale_builtins(folder)
        if diffs:
            sys.stdout.write("".join(diffs))
            print(f"regattn: {len(diffs)} generated file(s) are stale; run `regattn generate`", file=sys.stderr)
            return 1
        print("generated files are current")
        return 0
    start = time.perf_counter()
    written = files.write_builtins(folder, force=args.force)
    print(f"wrote {len(written)} files to {written[0].parent} in {time.perf_counter() - start:.2f} s")
    return 0


def _report_checks(reports, measure: str, bound) -> bool:
    """One line per report of generated functions against SymPy; False if any failed.

    A failed line names the functions beyond the bound.
    """
    for rep in reports:
        verdict = "ok" if rep.ok else "FAILED: " + ", ".join(_failed_functions(rep))
        print(f"{rep.where:<12} {rep.ctype:<6} {rep.points} points per function: {measure} = "
              f"{rep.max_error:.2g} ({verdict}, bound {bound(rep.ctype)})")
    return all(rep.ok for rep in reports)


def _failed_functions(rep) -> list[str]:
    """The functions of a report (of any Report class) whose worst error its own rule rejects."""
    import dataclasses

    return [f for f, v in rep.worst.items() if not dataclasses.replace(rep, worst={f: v}).ok]


def _verdict(failures: list[tuple[str, str]]) -> str:
    """The verdict line from ``(what failed, its scope)`` pairs.

    Scopes, from the worst: ``"all"`` (the derivation, the NumPy functions or
    the NumPy map are wrong: the map is not usable), ``"device"`` (double device
    code or its compilation: usable in NumPy only), ``"float"`` (float device
    code: usable in NumPy and, in float64, on a GPU).
    """
    if not failures:
        return "all checks passed"
    scopes = {scope for _, scope in failures}
    if "all" in scopes:
        usable = "do not use the map"
    elif "device" in scopes:
        usable = "the map is usable in NumPy only (not with CuPy on a GPU)"
    else:
        usable = "the map is usable in NumPy, and with CuPy on a GPU in float64 only"
    return "FAIL: " + "; ".join(what for what, _ in failures) + "; " + usable


def _report_failures(rep, scope: str) -> list[tuple[str, str]]:
    """``(what failed, scope)`` for a report that failed, else nothing."""
    if rep.ok:
        return []
    names = _failed_functions(rep)
    verb = "exceeds its bound" if len(names) == 1 else "exceed their bound"
    return [(f"{', '.join(names)} ({rep.ctype}, {rep.where}) {verb}", scope)]


def _report_nvrtc(source: str) -> bool:
    """Compile ``source`` with NVRTC for every architecture CI checks and print one line; False on failure."""
    from .codegen.compilers import ARCHES, nvrtc_available, nvrtc_compile

    if not nvrtc_available():
        print("nvrtc        not installed (pip install cuda-bindings nvidia-cuda-nvrtc): CUDA compile not checked")
        return True
    try:
        results = [nvrtc_compile(source, arch) for arch in ARCHES]
    except (RuntimeError, OSError) as exc:
        print(f"nvrtc        FAILED to run: {' '.join(str(exc).split())}")
        return False
    print("nvrtc        " + ", ".join(f"{r.arch} {'ok' if r.ok else 'FAILED'} ({r.ptx_size // 1024} kB PTX)" for r in results))
    for r in results:
        if not r.ok:
            print(r.log)
    return all(r.ok for r in results)


def _verify_continuous(args: argparse.Namespace) -> int:
    """``regattn verify --continuous``: derive the continuous map, check it by quadrature, generate and check its code."""
    import tempfile

    import numpy as np

    from .codegen import verify_continuous as VC
    from .codegen.files import load_module, write_atomic
    from .codegen.compilers import host_library
    from .codegen.continuous import generate_continuous_module
    from .continuous import check_density, derive_continuous

    reg = regularizer_from_args(args)
    start = time.perf_counter()
    cm = derive_continuous(reg)
    print(f"regularizer  omega(p) = {sp.sstr(reg.omega)}   ({reg.name})")
    print(f"derived      in {time.perf_counter() - start:.2f} s: {cm.family} density, support radius a = "
          f"{sp.sstr(cm.support_radius)}, threshold tau = {sp.sstr(cm.threshold)}")
    rng = random.Random(args.seed)
    worst_norm = worst_stat = mpmath.mpf(0)
    for _ in range(args.samples):
        norm, stat = check_density(cm, rng.uniform(-1, 1), rng.uniform(1e-3, 2), digits=30)
        worst_norm, worst_stat = max(worst_norm, norm), max(worst_stat, stat)
    ok = worst_norm < mpmath.mpf(10) ** -25 and worst_stat < mpmath.mpf(10) ** -25
    print(f"density      {args.samples} random (mu, sigma2), mpmath quadrature at 30 digits: |int p - 1| <= "
          f"{mpmath.nstr(worst_norm, 3)}, stationarity spread <= {mpmath.nstr(worst_stat, 3)} "
          f"({'ok' if ok else 'FAILED'}, bound 1e-25)")
    if not cm.closed_context:  # nothing closed-form to generate or check: refuse in one line
        raise DerivationError(cm.no_closed_context())
    name = args.name or f"continuous_{'custom' if args.expr else reg.name.split('(')[0]}"
    with tempfile.TemporaryDirectory(prefix="regattn-verify-") as tmp:
        start = time.perf_counter()
        path = Path(tmp) / f"{name}.py"
        write_atomic(path, generate_continuous_module(cm, name))
        module = load_module(path, prefix="_regattn_verify_")
        fns = VC.functions(cm)
        print(f"generated    {name}.py ({path.stat().st_size // 1024} kB, {len(fns)} functions, "
              f"{len(module.CUDA_KERNELS)} kernels) in {time.perf_counter() - start:.2f} s")

        def numpy_call(fname, xs):
            return float(np.broadcast_to(getattr(module, fname)(*[np.array([x]) for x in xs]), (1,))[0])

        reports = [VC.check(cm, numpy_call, "double", "numpy", points=args.points, seed=args.seed)]
        try:
            lib = host_library(module.CUDA_DEVICE_SOURCE, name, {f: len(a) for f, (_, a) in fns.items()}, Path(tmp))
            for ctype in ("double", "float"):
                reports.append(VC.check(cm, lambda f, xs, c=ctype: lib[c][f](*xs), ctype, "device (g++)",
                                        points=args.points, seed=args.seed))
        except RuntimeError as exc:
            print(f"device       host build failed: {exc}")
            ok = False
        ok &= _report_checks(reports, "max error / running bound", lambda c: f"1; {VC.UNIT[c]:g} per operation")
        ok &= _report_nvrtc(module.CUDA_SOURCE)
    print("verdict      " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
    return 0 if ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    if args.continuous:
        return _verify_continuous(args)
    import tempfile

    import numpy as np

    from .codegen import generate_module
    from .codegen import verify as V
    from .codegen.files import load_module, write_atomic
    from .codegen.compilers import host_library

    reg = regularizer_from_args(args)
    start = time.perf_counter()
    dv = derive_map(reg)
    took = time.perf_counter() - start
    params = {q.symbol.name: _parameter_value(q) for q in dv.parameters}
    rng = random.Random(args.seed)
    failures: list[tuple[str, str]] = []
    print(f"regularizer  omega(p) = {sp.sstr(dv.omega)}   ({dv.name})")
    print(f"derived      in {took:.2f} s: link {dv.inversion.method}, threshold {dv.threshold.kind}, "
          f"{'sparse' if dv.sparse else 'dense'}, weight w(p) = {sp.sstr(dv.weight)}")
    worst = mpmath.mpf(0)
    for _ in range(args.samples):
        n = rng.randint(1, 12)
        scores = [rng.gauss(0, 2) for _ in range(n)]
        probs = dv.evaluate(scores, digits=50, **params)
        worst = max(worst, kkt_residual(dv, scores, probs, digits=50, **params))
    good = worst < mpmath.mpf(10) ** -40
    if not good:
        failures.append(("the reference breaks the KKT conditions", "all"))
    print(f"reference    {args.samples} random score vectors{' at ' + ', '.join(f'{k} = {v}' for k, v in params.items()) if params else ''}: "
          f"max KKT residual {mpmath.nstr(worst, 3)} ({'ok' if good else 'FAILED'}, bound 1e-40)")

    name = args.name or ("custom" if args.expr else dv.name.split("(")[0])
    with tempfile.TemporaryDirectory(prefix="regattn-verify-") as tmp:
        start = time.perf_counter()
        path = Path(tmp) / f"{name}.py"
        write_atomic(path, generate_module(dv, name))
        module = load_module(path, prefix="_regattn_verify_")
        print(f"generated    {name}.py ({path.stat().st_size // 1024} kB, {len(V.functions(dv))} functions, "
              f"{len(module.CUDA_KERNELS)} kernels) in {time.perf_counter() - start:.2f} s")

        def numpy_call(fname, xs, ps):
            out = getattr(module, fname)(*[np.array([x]) for x in xs], *ps)
            return float(np.broadcast_to(np.asarray(out, dtype=np.float64), (1,))[0])

        reports = [V.check(dv, numpy_call, "double", "numpy", points=args.points, seed=args.seed)]
        try:
            npar = len(dv.parameters)
            lib = host_library(module.CUDA_DEVICE_SOURCE, name, {f: len(a) + npar for f, (_, a) in V.functions(dv).items()}, Path(tmp))
            for ctype in ("double", "float"):
                reports.append(V.check(dv, lambda f, xs, ps, c=ctype: lib[c][f](*xs, *ps), ctype, "device (g++)", points=args.points, seed=args.seed))
        except RuntimeError as exc:
            print(f"device       host build failed: {' '.join(str(exc).split())}")
            failures.append(("the device functions did not build with g++", "device"))
        _report_checks(reports, "max error / (1 + kappa)", lambda c: f"{V.TOLERANCE[c]:g}")
        for rep in reports:
            failures += _report_failures(rep, "all" if rep.where == "numpy" else "device" if rep.ctype == "double" else "float")
        from numeric import get_map

        mapping = get_map(module, **{k: float(v) for k, v in params.items()})
        worst_p = 0.0
        for _ in range(args.samples):
            n = rng.randint(1, 40)
            scores = np.array([rng.gauss(0, 3) for _ in range(n)])
            want = np.array([float(v) for v in dv.evaluate(scores.tolist(), digits=30, **params)])
            worst_p = max(worst_p, float(np.abs(mapping(scores) - want).max()))
        good = worst_p <= 1e-12
        if not good:
            failures.append(("p*(s) by numeric.get_map (float64, numpy) exceeds its bound", "all"))
        print(f"numeric map  p*(s) by numeric.get_map on {args.samples} random score vectors: max |p - p_ref| = "
              f"{worst_p:.2g} ({'ok' if good else 'FAILED'}, bound 1e-12)")
        if not _report_nvrtc(module.CUDA_SOURCE):
            failures.append(("CUDA_SOURCE does not compile with NVRTC", "device"))
    probs = dv.evaluate([-2, 0, sp.Rational(1, 2)], digits=30, **params)
    print("example      p*([-2, 0, 0.5]) = [" + ", ".join(mpmath.nstr(v, 6) for v in probs) + "]")
    print("verdict      " + _verdict(failures))
    return 1 if failures else 0


def _parameter_value(q: Parameter) -> sp.Rational:
    """The value ``verify`` gives a parameter: 13/10 where the domain allows it, else a point inside it."""
    value = sp.Rational(13, 10)
    if q.lower < value < q.upper:
        return value
    samples = q.samples()
    return samples[len(samples) // 2]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("regattn")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown (not installed)"


def _join_dash_values(argv: list[str]) -> list[str]:
    """``--expr -log(p)`` as ``--expr=-log(p)``: argparse would read a value starting with ``-`` as an option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if tok in _VALUE_OPTIONS and nxt is not None and nxt.startswith("-") and not nxt.startswith("--") and nxt != "-h":
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (an OSError as ``file: reason``)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``regattn`` console script."""
    parser = argparse.ArgumentParser(prog="regattn", description="Derive attention maps from regularizers.")
    parser.add_argument("--version", action="version", version=f"regattn {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also REGATTN_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_derive = sub.add_parser("derive", help="print the derivation of a map")
    _add_regularizer_arguments(p_derive)
    p_derive.add_argument("--latex", action="store_true", help="print LaTeX instead of text")
    p_derive.add_argument("--continuous", action="store_true",
                          help="the continuous map over densities on the real line, for scores theta_1 t + theta_2 t^2")
    p_derive.set_defaults(func=_cmd_derive)
    p_generate = sub.add_parser("generate", help="generate NumPy/CUDA modules from derivations")
    p_generate.add_argument("--check", action="store_true", help="exit 1 with a diff if the committed files are stale")
    _add_expr_arguments(p_generate)
    p_generate.add_argument("--name", help="the user map's name (a Python identifier that shadows no other module)")
    p_generate.add_argument("--out", type=Path, help="directory to write into")
    p_generate.add_argument("--force", action="store_true",
                            help="replace existing files even if regattn generate did not write them")
    p_generate.set_defaults(func=_cmd_generate)
    p_verify = sub.add_parser("verify", help="derive a map and verify the reference on random inputs")
    _add_regularizer_arguments(p_verify)
    p_verify.add_argument("--samples", type=int, default=50, help="random score vectors (default 50)")
    p_verify.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p_verify.add_argument("--points", type=int, default=40, help="points per generated function (default 40)")
    p_verify.add_argument("--continuous", action="store_true", help="verify the continuous map (densities on the real line)")
    p_verify.set_defaults(func=_cmd_verify)
    args = parser.parse_args(_join_dash_values(list(sys.argv[1:] if argv is None else argv)))
    if args.debug or os.environ.get("REGATTN_DEBUG", "") not in ("", "0"):
        return args.func(args)
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (regattn ... | head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (DerivationError, ValueError, OSError) as exc:
        print(f"regattn: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("regattn: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a defect of regattn: still one line; --debug shows where
        print(f"regattn: error: internal error, {type(exc).__name__}: {_one_line(exc)} "
              "(run with --debug or REGATTN_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
