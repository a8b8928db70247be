"""The verify pipeline: derive -> reference -> generate -> check every backend -> verdict.

:func:`verify_map` (discrete maps) and :func:`verify_continuous_map` (continuous
ones) run every check ``regattn verify`` reports and return a
:class:`Verification`: one :class:`Step` per check, each with the line it
prints and the failures it found, and the verdict.  The command is a thin face
over them; tests and users call them directly::

    >>> from derive import derive_map, tsallis
    >>> from derive.codegen.pipeline import verify_map
    >>> result = verify_map(derive_map(tsallis()), "entmax", samples=3, points=5)  # doctest: +SKIP
    >>> result.ok, result.verdict()  # doctest: +SKIP
    (True, 'all checks passed')

A failure carries a scope, from the worst: ``"all"`` (the derivation, the
NumPy functions or the NumPy map are wrong: the map is not usable),
``"device"`` (double device code or its compilation: usable in NumPy only),
``"float"`` (float device code: usable in NumPy and, in float64, on a GPU),
and a framework's name, ``"torch"`` or ``"jax"`` (the routines on its arrays in
float64: the map is usable, but not with that framework), or that name and
``" float"`` (the same in float32).  A framework that is not
installed, or NVRTC where its wheels are missing, is reported and not checked:
its step records what did not run (``Step.unchecked``), and the verdict
names it, ``all checks that ran passed; not checked: torch, jax, NVRTC (not
installed)``, so that a passing verdict never stands for a check that did not
run.  What did not run is no failure: ``ok`` stays true.

A failure also names the parts it affects (:func:`part_of`): a routine that
fails matters only where it is used.  ``omega`` and ``omega(0+)`` serve the
Fenchel-Young loss alone, the weight the JVP, ``d omega'/d q`` the gradient in
a parameter ``q``, and everything else the map itself.  The verdict judges the
map on the failures that reach it (the scopes above) and says for each other
part how many digits it loses, where, and in which precision, so that a map
whose loss cancels reads "the map and its JVP are within tolerance; the
Fenchel-Young loss (omega) loses up to 2.2 digits in float32 near p = 0.017
(device (g++), torch, jax): compute the loss in float64" rather than "do not
use the map".
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import mpmath
import numpy as np
import sympy as sp

from ..derivation import Derivation
from ..errors import DerivationError
from ..reference import kkt_residual
from ..regularizers import Parameter
from numeric import contract

__all__ = ["Step", "Failure", "Lost", "Verification", "verify_map", "verify_continuous_map", "parameter_value", "verdict",
           "part_of", "cost_step"]


class Lost(NamedTuple):
    """The worst error of one failed routine of a part other than the map: ``digits`` lost beyond its
    conditioning (``log10`` of the error over the type's unit roundoff) ``at`` a point such as ``p = 1.2e-06``."""

    part: str
    routine: str
    ctype: str
    where: str
    digits: float
    at: str


@dataclass(frozen=True)
class Failure:
    """What failed, its scope (see the module docstring), the parts of the map it affects and, for the parts
    other than the map, the digits each routine lost.  It unpacks as the ``(what, scope)`` pair."""

    what: str
    scope: str
    parts: tuple[str, ...] = ("map",)
    lost: tuple[Lost, ...] = ()

    def __iter__(self):
        return iter((self.what, self.scope))


#: The unit roundoff of each type: digits lost are counted against it.
UNIT = {"double": 2.0**-53, "float": 2.0**-24}
#: The parts of a map other than the map itself, in the verdict's order, and how the verdict names them.
PART_NAMES = {"JVP": "the JVP", "loss": "the Fenchel-Young loss"}


def part_of(routine: str) -> str:
    """The part of a map that uses a generated routine: ``"loss"`` for ``omega`` and ``omega_zero`` (used by the
    Fenchel-Young loss only), ``"JVP"`` for ``weight`` (the Jacobian's diagonal; the root threshold's Newton steps
    take it as a slope only, which moves the steps, not the root), ``"gradient in q"`` for
    ``omega_prime_d_q``, and ``"map"`` for every other routine (they compute ``p*(s)``)."""
    if routine in ("omega", "omega_zero"):
        return "loss"
    if routine == "weight":
        return "JVP"
    prefix = contract.PER_PARAMETER.name.format("")
    if routine.startswith(prefix):
        return f"gradient in {routine[len(prefix):]}"
    return "map"


@dataclass(frozen=True)
class Step:
    """One check: ``label`` and ``text`` make its line; ``failures`` hold a :class:`Failure` each (or a plain
    ``(what failed, scope)`` pair, which affects the map); ``unchecked``, for a check that did not run, is
    ``(what, why)``, e.g. ``("torch", "not installed")``, which the verdict names."""

    label: str
    text: str
    failures: tuple[Failure | tuple[str, str], ...] = ()
    log: str = ""
    unchecked: tuple[str, str] | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        return f"{self.label:<12} {self.text}" + (f"\n{self.log}" if self.log else "")


@dataclass
class Verification:
    """The steps of one verification, in order, and the verdict they give."""

    steps: list[Step] = field(default_factory=list)

    @property
    def failures(self) -> list[tuple[str, str]]:
        return [f for step in self.steps for f in step.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def unchecked(self) -> list[tuple[str, str]]:
        """``(what, why)`` for each check that did not run."""
        return [step.unchecked for step in self.steps if step.unchecked is not None]

    def verdict(self) -> str:
        return verdict(self.failures, self.unchecked)

    def report(self) -> str:
        """Every step's line, then the verdict line: what ``regattn verify`` prints."""
        return "\n".join([step.line() for step in self.steps] + [f"{'verdict':<12} {self.verdict()}"]) + "\n"


def verdict(failures: Sequence[Failure | tuple[str, str]], unchecked: Sequence[tuple[str, str]] = ()) -> str:
    """The verdict from failures (see the module docstring for scopes and parts) and the ``(what, why)`` of the
    checks that did not run.

    The failures that reach the map decide where it is usable, as before; those confined to other parts
    (the loss, the JVP, a parameter's gradient) are named each with the digits it loses, where and in which
    precision, and what to do: not to use it, or to compute it in float64 or without a framework.  The checks
    that did not run end the verdict, grouped by why: ``; not checked: torch, jax, NVRTC (not installed)``;
    with no failure it reads ``all checks that ran passed; not checked: ...``.
    """
    if unchecked:
        reasons = dict.fromkeys(why for _, why in unchecked)
        skipped = "; ".join(f"{', '.join(what for what, w in unchecked if w == why)} ({why})" for why in reasons)
        if not failures:
            return f"all checks that ran passed; not checked: {skipped}"
        return f"{verdict(failures)}; not checked: {skipped}"
    if not failures:
        return "all checks passed"
    failures = [f if isinstance(f, Failure) else Failure(*f) for f in failures]
    head = "FAIL: " + "; ".join(f.what for f in failures)
    scopes = {f.scope for f in failures if "map" in f.parts}
    if "all" in scopes:
        return head + "; do not use the map"
    others = [part for f in failures for part in f.parts if part != "map"]
    others = sorted(set(others), key=lambda q: (list(PART_NAMES).index(q) if q in PART_NAMES else len(PART_NAMES), q))
    if scopes:
        statements = [_map_usable(scopes)]
    else:
        statements = ["the map and its JVP are within tolerance" if "JVP" not in others else "the map is within tolerance"]
    statements += [_part_statement(part, [f for f in failures if part in f.parts]) for part in others]
    return head + "; " + "; ".join(statements)


def _map_usable(scopes: set[str]) -> str:
    """Where the map is usable given the scopes of the failures that reach it (none of them ``"all"``)."""
    frameworks = [t for t in contract.FRAMEWORKS if t in scopes]
    float64_only = [t for t in contract.FRAMEWORKS if f"{t} float" in scopes and t not in scopes]
    if "device" in scopes:
        usable = "the map is usable in NumPy only (not with CuPy on a GPU)"
    elif "float" in scopes:
        usable = "the map is usable in NumPy, and with CuPy on a GPU in float64 only"
    else:
        usable = "the map is usable in NumPy and with CuPy on a GPU"
    usable += f", not with {' or '.join(frameworks)}" if frameworks else ""
    usable += f", with {' and '.join(float64_only)} in float64 only" if float64_only else ""
    return usable


def _part_statement(part: str, failures: list[Failure]) -> str:
    """``the Fenchel-Young loss (omega) loses up to 4.9 digits in float32 near p = 1.2e-06 (device (g++), torch):
    compute the loss in float64``."""
    name = PART_NAMES.get(part, f"the {part}")
    short = name.replace("the Fenchel-Young loss", "the loss")
    lost = [lo for f in failures for lo in f.lost if lo.part == part]
    routines = sorted({lo.routine for lo in lost})
    text = name + (f" ({', '.join(routines)})" if routines else "")
    amounts = []
    for ctype, label in (("double", "float64"), ("float", "float32")):
        here = [lo for lo in lost if lo.ctype == ctype]
        if here:
            worst = max(here, key=lambda lo: lo.digits)
            checks = ", ".join(dict.fromkeys(lo.where for lo in here))
            near = f" near {worst.at}" if worst.at else ""
            everything = worst.digits >= -math.log10(UNIT[ctype])  # an error as large as the value, or inf
            amount = "all its digits" if everything else f"up to {worst.digits:.1f} digits"
            amounts.append(f"{amount} in {label}{near} ({checks})")
    text += " loses " + " and ".join(amounts) if amounts else " exceeds its bound"
    scopes = {f.scope for f in failures}
    if "all" in scopes:
        return f"{text}: do not use {short}"
    names = {"device": "CuPy", **{t: t for t in contract.FRAMEWORKS}}
    bad64 = [names[s] for s in ("device", *contract.FRAMEWORKS) if s in scopes]
    # float device code rounds as NumPy and CuPy do on float32 arrays (the same printed expression): with it
    # the advice is general, else it names the frameworks
    in_float = [t for t in contract.FRAMEWORKS if f"{t} float" in scopes]
    advice = [f"do not compute {short} with {' or '.join(bad64)}"] if bad64 else []
    if "float" in scopes or in_float:
        where = "" if "float" in scopes else f" with {' and '.join(in_float)}"
        advice.append(f"elsewhere in float64 only{where}" if bad64 else f"compute {short} in float64{where}")
    return f"{text}: {', '.join(advice)}"


def parameter_value(q: Parameter) -> sp.Rational:
    """The value verify gives a parameter: 13/10 where the domain allows it, else a point inside it."""
    value = sp.Rational(13, 10)
    if q.lower < value < q.upper:
        return value
    samples = q.samples()
    return samples[len(samples) // 2]


def _failed_functions(rep) -> list[str]:
    """The functions of a report (of any Report class) whose worst error its own rule rejects."""
    return [f for f, v in rep.worst.items() if not dataclasses.replace(rep, worst={f: v}).ok]


def _scope(rep) -> str:
    """A failed check's scope: the NumPy functions ("all"), a framework's routines, the double device code,
    or the float one."""
    if rep.where in contract.FRAMEWORKS:
        return rep.where if rep.ctype == "double" else f"{rep.where} float"
    return "all" if rep.where == "numpy" else "device" if rep.ctype == "double" else "float"


def _framework_caller(target: str, table: dict, ctype: str):
    """``call(fname, args, params) -> float`` through the routines ``table`` on ``target``'s arrays in ``ctype``."""
    if target == "torch":
        import torch

        dt = torch.float64 if ctype == "double" else torch.float32

        def call(fname, xs, ps):
            value = table[fname](*[torch.tensor([x], dtype=dt) for x in xs], *[torch.tensor(q, dtype=dt) for q in ps])
            return float(torch.as_tensor(value, dtype=torch.float64).reshape(-1)[0])

        return call
    import jax
    import jax.numpy as jnp

    dt = jnp.float64 if ctype == "double" else jnp.float32

    def call(fname, xs, ps):
        with jax.enable_x64(True):
            value = table[fname](*[jnp.asarray([x], dtype=dt) for x in xs], *[jnp.asarray(q, dtype=dt) for q in ps])
            return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])

    return call


def _framework_steps(dv: Derivation, module, points: int, seed: int) -> list[Step]:
    """The routines run on each framework's arrays (:data:`numeric.contract.FRAMEWORKS`) against SymPy, in double
    and float, with the bounds of the device functions; a framework that is not installed is one line."""
    from . import verify as V

    steps = []
    for target in contract.FRAMEWORKS:
        try:
            table = importlib.import_module(f"numeric.{target}.maps").routine_table(module)  # imports the framework
        except ImportError:
            steps.append(Step(target, f"not installed (pip install 'regattn[{target}]'): {target} routines not checked",
                              unchecked=(target, "not installed")))
            continue
        reports = [V.check(dv, _framework_caller(target, table, ctype), ctype, target, points=points, seed=seed)
                   for ctype in ("double", "float")]
        steps += _check_steps(reports, "max error / (1 + kappa)", lambda c: f"{V.TOLERANCE[c]:g}")
    return steps


def _function_steps(numpy_report, build, check, measure: str, bound: Callable[[str], str]) -> list[Step]:
    """Steps for the generated functions: the NumPy ``numpy_report``, then the device code built by
    ``build()`` (g++) and checked by ``check(lib, ctype)`` in double and float; a failed build is a step."""
    reports, failure = [numpy_report], None
    try:
        lib = build()
        reports += [check(lib, ctype) for ctype in ("double", "float")]
    except RuntimeError as exc:
        failure = Step("device", f"host build failed: {' '.join(str(exc).split())}",
                       (("the device functions did not build with g++", "device"),))
    return _check_steps(reports, measure, bound) + ([failure] if failure else [])


def _check_steps(reports, measure: str, bound: Callable[[str], str]) -> list[Step]:
    """One step per report of generated functions against SymPy, naming the functions beyond the bound."""
    steps = []
    for rep in reports:
        names = _failed_functions(rep)
        result = "ok" if rep.ok else "FAILED: " + ", ".join(names)
        text = f"{rep.ctype:<6} {rep.points} points per function: {measure} = {rep.max_error:.2g} ({result}, bound {bound(rep.ctype)})"
        failures = ()
        if not rep.ok:
            verb = "exceeds its bound" if len(names) == 1 else "exceed their bound"
            parts = tuple(dict.fromkeys(part_of(n) for n in names))
            lost = tuple(_lost(rep, n) for n in names if part_of(n) != "map")
            failures = (Failure(f"{', '.join(names)} ({rep.ctype}, {rep.where}) {verb}", _scope(rep), parts, lost),)
        steps.append(Step(rep.where, text, failures))
    return steps


def _lost(rep, routine: str) -> Lost:
    """How many digits ``routine`` lost in ``rep``, and at which of its arguments."""
    args = {r.name: r.args for r in contract.ROUTINES}.get(routine, contract.PER_PARAMETER.args)
    at = getattr(rep, "at", {}).get(routine, ())
    near = ", ".join(f"{a} = {v:.2g}" for a, v in zip(args, at))
    error = rep.worst[routine]
    digits = math.inf if not math.isfinite(error) else math.log10(max(error, UNIT[rep.ctype]) / UNIT[rep.ctype])
    return Lost(part_of(routine), routine, rep.ctype, rep.where, digits, near)


def _nvrtc_step(source: str) -> Step:
    """Compile ``source`` with NVRTC for every architecture CI checks."""
    from .compilers import ARCHES, nvrtc_available, nvrtc_compile

    if not nvrtc_available():
        return Step("nvrtc", "not installed (pip install cuda-bindings nvidia-cuda-nvrtc): CUDA compile not checked",
                    unchecked=("NVRTC", "not installed"))
    failed = (("CUDA_SOURCE does not compile with NVRTC", "device"),)
    try:
        results = [nvrtc_compile(source, arch) for arch in ARCHES]
    except (RuntimeError, OSError) as exc:
        return Step("nvrtc", f"FAILED to run: {' '.join(str(exc).split())}", failed)
    text = ", ".join(f"{r.arch} {'ok' if r.ok else 'FAILED'} ({r.ptx_size // 1024} kB PTX)" for r in results)
    logs = "\n".join(r.log for r in results if not r.ok)
    return Step("nvrtc", text, () if all(r.ok for r in results) else failed, logs)


def cost_step(mapping, timing: bool = True) -> Step:
    """The step ``cost``: the rule that solves ``mapping``'s threshold (:func:`numeric.cost.rule`, read off its
    module), sparse or dense and, with ``timing``, its NumPy forward time over entmax15's
    (:func:`numeric.cost.relative_time`).  It judges nothing: a map that does not run on the timing's input says
    so on the line, and the verdict stays the other steps'."""
    from numeric import cost

    sparse = cost.is_sparse(mapping)
    text = f"{cost.rule(mapping).line()}, {'sparse' if sparse else 'dense' if sparse is False else 'sparse or dense'}"
    values = ", ".join(f"{k} = {v:g}" for k, v in mapping.params.items() if isinstance(v, float))
    text = f"at {values}: {text}" if values else text  # (the rule, and the time, may change with them)
    if timing:
        try:
            text += f"; {cost.relative_time(mapping).text()}"
        except Exception as exc:  # (whatever stops the map here, the checks above judge it)
            text += f"; time not measured: {type(exc).__name__}: {' '.join(str(exc).split())}"
    return Step("cost", text)


def _emit(verification: Verification, step: Step, on_step: Callable[[Step], None] | None) -> None:
    verification.steps.append(step)
    if on_step is not None:
        on_step(step)


def verify_map(dv: Derivation, name: str = "custom", *, samples: int = 20, points: int = 40, seed: int = 0,
               on_step: Callable[[Step], None] | None = None, took: float | None = None,
               timing: bool = True) -> Verification:
    """Every check of a discrete map's derivation and generated code.

    The reference on ``samples`` random score vectors against the KKT
    conditions; the module generated as ``name`` (in a temporary folder): its
    NumPy functions (double) and device functions compiled by g++ (double,
    float) against SymPy at ``points`` points each; the map
    :func:`numeric.get_map` builds from it against the reference; what the map
    costs (:func:`cost_step`: its rule, sparse or dense and, with ``timing``,
    its time beside entmax15's; no check); NVRTC.
    ``on_step`` is called with each :class:`Step` as it completes (the CLI
    prints it); ``took`` is the derivation's time, for the first line.
    """
    from . import verify as V
    from .compilers import host_library
    from .emit import generate_module
    from .files import load_module, write_atomic

    out = Verification()
    params = {q.symbol.name: parameter_value(q) for q in dv.parameters}
    rng = random.Random(seed)
    _emit(out, Step("regularizer", f"omega(p) = {sp.sstr(dv.omega)}   ({dv.name})"), on_step)
    timing = f"in {took:.2f} s: " if took is not None else ""
    _emit(out, Step("derived", f"{timing}link {dv.inversion.method} ({dv.inversion.form.form}), threshold {dv.threshold.kind}, "
                               f"{'sparse' if dv.sparse else 'dense'}, weight w(p) = {sp.sstr(dv.weight)}"), on_step)
    worst = mpmath.mpf(0)
    for _ in range(samples):
        scores = [rng.gauss(0, 2) for _ in range(rng.randint(1, 12))]
        probs = dv.evaluate(scores, digits=50, **params)
        worst = max(worst, kkt_residual(dv, scores, probs, digits=50, **params))
    good = worst < mpmath.mpf(10) ** -40
    at = " at " + ", ".join(f"{k} = {v}" for k, v in params.items()) if params else ""
    _emit(out, Step("reference", f"{samples} random score vectors{at}: max KKT residual {mpmath.nstr(worst, 3)} "
                                 f"({'ok' if good else 'FAILED'}, bound 1e-40)",
                    () if good else (("the reference breaks the KKT conditions", "all"),)), on_step)

    with tempfile.TemporaryDirectory(prefix="regattn-verify-") as tmp:
        start = time.perf_counter()
        path = Path(tmp) / f"{name}.py"
        write_atomic(path, generate_module(dv, name))
        module = load_module(path, prefix="_regattn_verify_")
        _emit(out, Step("generated", f"{name}.py ({path.stat().st_size // 1024} kB, {len(V.functions(dv))} functions, "
                                     f"{len(module.CUDA_KERNELS)} kernels) in {time.perf_counter() - start:.2f} s"), on_step)

        def numpy_call(fname, xs, ps):
            value = getattr(module, fname)(*[np.array([x]) for x in xs], *ps)
            return float(np.broadcast_to(np.asarray(value, dtype=np.float64), (1,))[0])

        npar = len(dv.parameters)
        for step in _function_steps(
            V.check(dv, numpy_call, "double", "numpy", points=points, seed=seed),
            lambda: host_library(module.CUDA_DEVICE_SOURCE, name, {f: len(a) + npar for f, (_, a) in V.functions(dv).items()}, Path(tmp)),
            lambda lib, ctype: V.check(dv, lambda f, xs, ps: lib[ctype][f](*xs, *ps), ctype, "device (g++)", points=points, seed=seed),
            "max error / (1 + kappa)", lambda c: f"{V.TOLERANCE[c]:g}",
        ):
            _emit(out, step, on_step)

        for step in _framework_steps(dv, module, points, seed):
            _emit(out, step, on_step)

        from numeric import get_map

        mapping = get_map(module, **{k: float(v) for k, v in params.items()})
        worst_p = 0.0
        for _ in range(samples):
            scores = np.array([rng.gauss(0, 3) for _ in range(rng.randint(1, 40))])
            want = np.array([float(v) for v in dv.evaluate(scores.tolist(), digits=30, **params)])
            worst_p = max(worst_p, float(np.abs(mapping(scores) - want).max()))
        good = worst_p <= 1e-12
        _emit(out, Step("numeric map", f"p*(s) by numeric.get_map on {samples} random score vectors: max |p - p_ref| = "
                                       f"{worst_p:.2g} ({'ok' if good else 'FAILED'}, bound 1e-12)",
                        () if good else (("p*(s) by numeric.get_map (float64, numpy) exceeds its bound", "all"),)), on_step)
        _emit(out, cost_step(mapping, timing), on_step)
        _emit(out, _nvrtc_step(module.CUDA_SOURCE), on_step)
    probs = dv.evaluate([-2, 0, sp.Rational(1, 2)], digits=30, **params)
    _emit(out, Step("example", "p*([-2, 0, 0.5]) = [" + ", ".join(mpmath.nstr(v, 6) for v in probs) + "]"), on_step)
    return out


def verify_continuous_map(cm, name: str, *, samples: int = 20, points: int = 40, seed: int = 0,
                          on_step: Callable[[Step], None] | None = None, took: float | None = None) -> Verification:
    """Every check of a continuous map (:class:`~derive.continuous.ContinuousDerivation`).

    Its density on ``samples`` random ``(mu, sigma2)`` by mpmath quadrature
    (normalisation and stationarity); the module generated as ``name``: NumPy
    and g++ device functions against SymPy under a running error bound; NVRTC.
    A family without a closed-form context raises :class:`DerivationError`
    (nothing to generate).
    """
    from . import verify_continuous as VC
    from ..continuous import check_density
    from .compilers import host_library
    from .continuous import DEVICE_FUNCTIONS, generate_continuous_module, numpy_function
    from .files import load_module, write_atomic

    out = Verification()
    reg = cm.regularizer
    _emit(out, Step("regularizer", f"omega(p) = {sp.sstr(reg.omega)}   ({reg.name})"), on_step)
    timing = f"in {took:.2f} s: " if took is not None else ""
    _emit(out, Step("derived", f"{timing}{cm.family} density, support radius a = {sp.sstr(cm.support_radius)}, "
                               f"threshold tau = {sp.sstr(cm.threshold)}"), on_step)
    rng = random.Random(seed)
    worst_norm = worst_stat = mpmath.mpf(0)
    for _ in range(samples):
        norm, stat = check_density(cm, rng.uniform(-1, 1), rng.uniform(1e-3, 2), digits=30)
        worst_norm, worst_stat = max(worst_norm, norm), max(worst_stat, stat)
    good = worst_norm < mpmath.mpf(10) ** -25 and worst_stat < mpmath.mpf(10) ** -25
    _emit(out, Step("density", f"{samples} random (mu, sigma2), mpmath quadrature at 30 digits: |int p - 1| <= "
                               f"{mpmath.nstr(worst_norm, 3)}, stationarity spread <= {mpmath.nstr(worst_stat, 3)} "
                               f"({'ok' if good else 'FAILED'}, bound 1e-25)",
                    () if good else (("the density breaks normalisation or stationarity", "all"),)), on_step)
    if not cm.closed_context:  # nothing closed-form to generate or check: refuse in one line
        raise DerivationError(cm.no_closed_context())
    with tempfile.TemporaryDirectory(prefix="regattn-verify-") as tmp:
        start = time.perf_counter()
        path = Path(tmp) / f"{name}.py"
        write_atomic(path, generate_continuous_module(cm, name))
        module = load_module(path, prefix="_regattn_verify_")
        fns = VC.functions(cm)
        _emit(out, Step("generated", f"{name}.py ({path.stat().st_size // 1024} kB, {len(fns)} functions, "
                                     f"{len(module.CUDA_KERNELS)} kernels) in {time.perf_counter() - start:.2f} s"), on_step)

        def numpy_call(fname, xs):
            return float(np.broadcast_to(numpy_function(module, fname)(*[np.array([x]) for x in xs]), (1,))[0])

        for step in _function_steps(
            VC.check(cm, numpy_call, "double", "numpy", points=points, seed=seed),
            lambda: host_library(module.CUDA_DEVICE_SOURCE, name,
                                 {f: len(a) for f, (_, a) in fns.items() if f in DEVICE_FUNCTIONS}, Path(tmp)),
            lambda lib, ctype: VC.check(cm, lambda f, xs: lib[ctype][f](*xs), ctype, "device (g++)", points=points,
                                        seed=seed, only=DEVICE_FUNCTIONS),
            "max error / running bound", lambda c: f"1; {VC.UNIT[c]:g} per operation",
        ):
            _emit(out, step, on_step)
        _emit(out, _nvrtc_step(module.CUDA_SOURCE), on_step)
    from .. import cost

    _emit(out, Step("cost", f"{cost.continuous_rule(cm)}, {'sparse' if cm.family == 'compact' else 'dense'}; "
                            "time not measured: a continuous map has no rows of scores to time beside entmax15"), on_step)
    return out
