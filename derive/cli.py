"""The ``regattn`` command.

    regattn derive REG [--alpha 3/2] | --expr "EXPR" [--param NAME[:LOWER:UPPER]]... [--latex]
    regattn generate [--check] [--out DIR] [--force]   built-ins -> numeric/_generated/ (or DIR)
    regattn generate --expr "EXPR" --name NAME --out DIR [--param ...] [--force]
    regattn verify REG [--alpha 3/2] | --expr "EXPR" [--param ...] [--samples N] [--hypothesis N]
    regattn --version

``REG`` is a regularizer (shannon, gini, tsallis) or the name of its map
(softmax, sparsemax, entmax15, entmax).  ``derive`` prints the derivation
(pretty text, or LaTeX with ``--latex``), then what the map costs: the rule
that solves its threshold (``closed``, ``sort``, ``root`` or ``KKT``, see
:mod:`numeric.cost`) and whether it is sparse, two lines ``rule: ...`` and
``sparse: ...`` (LaTeX comments ``% rule: ...`` with ``--latex``, which keep
the LaTeX valid).  ``verify`` derives the map and
checks the high-precision reference on random score vectors against the KKT
conditions, the generated functions against SymPy, and the map
``numeric.get_map`` builds, printing one line per check and a verdict naming
what failed and what did not run (a framework or NVRTC not installed); it is
the main job of the README.  Its line ``cost`` names the generated module's
rule, sparse or dense, and its NumPy forward time over entmax15's on 512 x 256
float32 scores (one thread, interleaved calls); it judges nothing.
``--hypothesis N`` then property-tests the generated map with N hypothesis examples (:func:`derive.testing.check_map`:
values, simplex, KKT, JVP, Fenchel-Young loss and its gradient on NumPy, torch
and JAX, float64 and float32), one line per backend and check, and prints the
falsifying example of a failure.  Bad input, and any other
error (a full disk, an unwritable folder), prints one line
``regattn: error: ...`` and exits with status 2; ``--debug`` (or
``REGATTN_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import sympy as sp

from ._timelimit import hard_limits
from .argmax import derive_map
from .errors import DerivationError
from .codegen import builtins
from .family import derive_family, stated_cases
from .regularizers import FAMILIES, Parameter, Regularizer, check_parameter_name

__all__ = ["main", "regularizer_from_args", "parameter_from_text"]



def _map_names() -> dict[str, tuple[str, str | None]]:
    """Map name -> the regularizer family it comes from and the alpha it fixes (the one registry, read at each call)."""
    return {b.name: (b.family, b.alpha) for b in builtins.BUILTINS}


def _builtin(name: str):
    return next(b for b in builtins.BUILTINS if b.name == name)


def _names() -> tuple[str, ...]:
    return tuple(FAMILIES) + tuple(_map_names())

#: options whose value may start with "-" (an expression such as -log(p), a negative bound)
_VALUE_OPTIONS = ("--expr", "--param", "--alpha")


def _add_regularizer_arguments(parser: argparse.ArgumentParser) -> None:
    # checked by regularizer_from_args, not by argparse's choices: an unknown name is one line naming the closest
    parser.add_argument("regularizer", nargs="?", metavar="{" + ",".join(_names()) + "}",
                        help="a built-in regularizer, or the name of its map")
    parser.add_argument("--alpha", help="Tsallis alpha, e.g. 3/2 or 1.5 (omit for symbolic alpha: > 1 for tsallis, "
                                        "the map's own domain for a map's name)")
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
    try:
        check_parameter_name(name)
    except DerivationError as exc:
        raise DerivationError(f"--param {text!r}: {exc}") from None
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
    """The regularizer named by ``regularizer``/``--alpha``/``--expr``/``--param``; an unknown name is a
    :class:`DerivationError` naming the closest built-in and listing them all."""
    names = ", ".join(_names())
    if args.regularizer is not None and args.regularizer not in _names():
        closest = difflib.get_close_matches(args.regularizer, _names(), n=1)
        hint = f" (did you mean {closest[0]!r}?)" if closest else ""
        raise DerivationError(f"no regularizer or map named {args.regularizer!r}{hint}: built-ins are {names}")
    if (args.regularizer is None) == (args.expr is None):
        raise DerivationError(f"give exactly one of a built-in ({names}) or --expr")
    params = getattr(args, "param", None) or []
    if params and args.expr is None:
        raise DerivationError("--param applies to --expr only")
    regularizer, alpha = args.regularizer, args.alpha
    if regularizer in _map_names() and alpha is None:  # the map's own regularizer (its alpha or alpha's domain)
        return _builtin(regularizer).regularizer()
    if regularizer in _map_names():
        regularizer, fixed = _map_names()[regularizer]
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
    factory = FAMILIES[regularizer]
    if alpha is None:
        return factory()
    try:
        value = sp.Rational(alpha)
    except (TypeError, ValueError):
        raise DerivationError(f"--alpha must be a number such as 3/2 or 1.5, got {alpha!r}") from None
    return factory(value)


def _cmd_derive(args: argparse.Namespace) -> int:
    """``regattn derive``: the derivation, then the rule that solves the map's threshold and whether it is sparse
    (:mod:`derive.cost`; LaTeX comments with ``--latex``)."""
    from . import cost

    reg = regularizer_from_args(args)
    if args.continuous:
        from .continuous import derive_continuous

        cm = derive_continuous(reg)
        sys.stdout.write(cm.latex() + "\n" if args.latex else cm.pretty())
        sys.stdout.write(cost.continuous_summary(cm, latex=args.latex))
        return 0
    if stated_cases(reg) is not None:  # a family: each case
        fam = derive_family(reg)
        for case in fam.cases:
            dv = derive_map(case.regularizer)
            q = fam.parameter.symbol
            where = f"{q} = {case.lower}" if case.is_point else f"{q} in ({case.lower}, {case.upper})"
            sys.stdout.write(f"case {where}:\n")
            sys.stdout.write(dv.latex() + "\n" if args.latex else dv.pretty())
            sys.stdout.write(cost.summary(dv, latex=args.latex))
        return 0
    dv = derive_map(reg)
    sys.stdout.write(dv.latex() + "\n" if args.latex else dv.pretty())
    nosum = args.regularizer in _map_names() and dict(_builtin(args.regularizer).keywords).get("total", 1) is None
    if nosum:
        from .nosum import describe  # (the name's map has no sum: sigmoid, relu)

        sys.stdout.write("\n" + describe(dv, latex=args.latex))
    sys.stdout.write(cost.summary(dv, latex=args.latex, nosum=nosum))
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


def _verdict(failures, unchecked=()) -> str:
    """The verdict line's text (see :func:`derive.codegen.pipeline.verdict`)."""
    from .codegen.pipeline import verdict

    return verdict(failures, unchecked)


def _free_name(name: str) -> str:
    """``name``, or ``name_map``, ``name_map2``, ...: the first that shadows no module and is not imported (the
    module ``--hypothesis`` generates and imports)."""
    from .codegen.files import check_module_name

    for candidate in (name, *(f"{name}_map{i or ''}" for i in range(100))):
        try:
            check_module_name(candidate)
        except DerivationError:
            continue
        if candidate not in sys.modules:
            return candidate
    raise DerivationError(f"no free module name for the map {name!r} to check")  # pragma: no cover


def _hypothesis_steps(reg: Regularizer, name: str, examples: int, seed: int, unchecked=()) -> list:
    """``--hypothesis``: :func:`derive.testing.check_map` on the module generated from ``reg`` (into a temporary
    folder, imported while it runs) as steps of the verification: one per backend and check, one per backend not
    installed (a verdict's ``not checked``, unless ``unchecked`` names it already), or one for the failure with the
    falsifying example as its log."""
    from .codegen.pipeline import Failure, Step

    try:
        from .testing import MapCheckError, check_map, generated_map
    except ImportError as exc:  # (hypothesis is an optional dependency)
        raise DerivationError(str(exc)) from None
    with generated_map(reg, _free_name(name)) as module:
        try:
            result = check_map(module, max_examples=examples, seed=seed)
        except MapCheckError as exc:
            scope = "all" if exc.backend == "numpy" else exc.backend if exc.dtype == "float64" else f"{exc.backend} float"
            part = {"JVP": "JVP", "loss": "loss", "gradient": "loss"}.get(exc.check, "map")
            example = str(exc).partition("\n")[2]
            what = f"{exc.check} ({exc.dtype}, {exc.backend}) fails a property check at the example printed"
            return [Step("hypothesis", f"{exc.backend} {exc.check} FAILED ({exc.dtype}): {exc.detail}; "
                                       "falsifying example (shrunk):", (Failure(what, scope, (part,)),), example)]
    steps = [Step("hypothesis", f"{line.line()} (ok)") for line in result.lines]
    for backend, why in result.skipped:
        steps.append(Step("hypothesis", f"{backend} not checked: {why} (pip install 'regattn[{backend}]')",
                          unchecked=None if (backend, why) in unchecked else (backend, why)))
    return steps


def _cmd_verify(args: argparse.Namespace) -> int:
    """``regattn verify``: the library's verify pipeline, printing each step as it completes, then (``--hypothesis
    N``) the property checks of the generated map."""
    from .codegen import pipeline

    reg = regularizer_from_args(args)
    if args.hypothesis is not None and args.continuous:
        raise DerivationError("--hypothesis applies to discrete maps, not to --continuous")
    if args.hypothesis is not None and args.hypothesis < 1:
        raise DerivationError(f"--hypothesis takes a number of examples >= 1, got {args.hypothesis}")
    show = lambda step: print(step.line(), flush=True)  # noqa: E731
    start = time.perf_counter()
    if args.continuous:
        from .continuous import derive_continuous

        cm = derive_continuous(reg)
        name = args.name or f"continuous_{'custom' if args.expr else reg.name.split('(')[0]}"
        result = pipeline.verify_continuous_map(cm, name, samples=args.samples, points=args.points, seed=args.seed,
                                                on_step=show, took=time.perf_counter() - start)
    elif stated_cases(reg) is not None:  # a family: each case, each verdict
        fam = derive_family(reg)
        base = args.name or ("custom" if args.expr else reg.name.split("(")[0])
        ok = True
        for i, case in enumerate(fam.cases):
            q = fam.parameter.symbol
            print(f"case {q} = {case.lower}" if case.is_point else f"case {q} in ({case.lower}, {case.upper})", flush=True)
            result = pipeline.verify_map(derive_map(case.regularizer), f"{base}_case{i}", samples=args.samples,
                                         points=args.points, seed=args.seed, on_step=show,
                                         took=time.perf_counter() - start)
            print(f"{'verdict':<12} {result.verdict()}")
            ok = ok and result.ok
            start = time.perf_counter()
        if args.hypothesis is not None:  # the family as one map, its parameter drawn across the cases
            print(f"family {fam.parameter.symbol} in ({fam.parameter.lower}, {fam.parameter.upper})", flush=True)
            result = pipeline.Verification()
            for step in _hypothesis_steps(reg, base, args.hypothesis, args.seed):
                show(step)
                result.steps.append(step)
            print(f"{'verdict':<12} {result.verdict()}")
            ok = ok and result.ok
        return 0 if ok else 1
    else:
        dv = derive_map(reg)
        name = args.name or ("custom" if args.expr else dv.name.split("(")[0])
        result = pipeline.verify_map(dv, name, samples=args.samples, points=args.points, seed=args.seed,
                                     on_step=show, took=time.perf_counter() - start)
        if args.hypothesis is not None:
            for step in _hypothesis_steps(reg, name, args.hypothesis, args.seed, result.unchecked):
                show(step)
                result.steps.append(step)
    print(f"{'verdict':<12} {result.verdict()}")
    return 0 if result.ok else 1


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
    about = "print the derivation of a map, the rule that solves its threshold and whether it is sparse"
    p_derive = sub.add_parser("derive", help=about, description=about + " (with --latex, as LaTeX comments)")
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
    about = ("derive a map, verify the reference on random inputs, and say what the map costs (its rule, sparse or "
             "dense, its time beside entmax15)")
    p_verify = sub.add_parser("verify", help=about, description=about + ": the line 'cost' times the NumPy forward on "
                              "512 x 256 float32 N(0, 1) scores, one thread, the median of interleaved calls; it judges "
                              "nothing")
    _add_regularizer_arguments(p_verify)
    p_verify.add_argument("--samples", type=int, default=50, help="random score vectors (default 50)")
    p_verify.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p_verify.add_argument("--points", type=int, default=40, help="points per generated function (default 40)")
    p_verify.add_argument("--continuous", action="store_true", help="verify the continuous map (densities on the real line)")
    p_verify.add_argument("--hypothesis", type=int, metavar="N", default=None,
                          help="then property-test the generated map with N hypothesis examples (derive.testing.check_map: "
                               "values, simplex, KKT, JVP, loss on numpy, torch, jax; needs hypothesis)")
    p_verify.set_defaults(func=_cmd_verify)
    args = parser.parse_args(_join_dash_values(list(sys.argv[1:] if argv is None else argv)))
    if args.debug or os.environ.get("REGATTN_DEBUG", "") not in ("", "0"):
        with hard_limits():
            return args.func(args)
    try:
        with hard_limits():  # (the time limit holds through a long call into C: the work in a child process)
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
