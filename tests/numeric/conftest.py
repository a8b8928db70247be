"""Maps under test: the built-ins and three user regularizers generated into a temporary package (two of them with
no closed-form link: one dense, one sparse)."""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from functools import lru_cache

import pytest
import sympy as sp

from derive import Regularizer, derive_map, generate_module
from derive.codegen.builtins import BUILTIN_MAPS, FAMILY_MAPS
from derive.family import derive_family
from tests.profile import THOROUGH

USER = {"shannon_gini": "p*log(p) + p**2/2", "cube": "p**3", "gini_log1p": "p**2/2 + p*log(1 + p)"}
PARAMS = {"entmax": {"alpha": 1.3}, "entmax_sparse": {"alpha": 1.3}, "entmax_dense": {"alpha": 0.6}}
#: (name, parameters) of every map the torch and JAX backends are tested with: the built-ins, alpha-entmax at a
#: few alphas, the user maps
MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 1.3}), ("entmax", {"alpha": 1.01}),
        ("entmax", {"alpha": 5.0}), ("entmax", {"alpha": 0.6}), ("shannon_gini", {}), ("cube", {}), ("gini_log1p", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]
#: the maps of the framework suites (tests/torch, tests/jax), which check the framework maps against the NumPy
#: maps: every one of MAPS in the thorough profile; in the others alpha-entmax at the ends of its range (1.01,
#: 5.0) is left to the NumPy suite
FRAMEWORK_MAPS = [m for m in MAPS if THOROUGH or m[1].get("alpha") not in (1.01, 5.0)]
FRAMEWORK_IDS = [IDS[MAPS.index(m)] for m in FRAMEWORK_MAPS]


class FamilyDerivation:
    """The derivations of a family's cases (:func:`derive.family.derive_family`) as one: ``evaluate`` takes the
    case of its parameter's value (the reference of the family ``entmax`` at any alpha)."""

    def __init__(self, reg):
        fam = derive_family(reg)
        self.name, self.parameter = fam.parameter.symbol.name, fam.parameter.symbol.name
        self.cases = [(float(c.lower), float(c.upper), derive_map(c.regularizer)) for c in fam.cases]

    def case(self, **params):
        """``(derivation, params)`` of the case holding the parameter's value (a point's without the parameter)."""
        value = float(params[self.parameter])
        for lo, hi, dv in self.cases:
            if (value == lo) if lo == hi else (lo < value < hi):
                return dv, {k: v for k, v in params.items() if k != self.parameter or lo != hi}
        raise ValueError(f"{self.parameter} = {value} lies in no case")

    def evaluate(self, scores, digits: int = 50, **params):
        dv, rest = self.case(**params)
        return dv.evaluate(scores, digits=digits, **rest)


def case_derivation(name: str, params: dict):
    """``(derivation, params)`` for the reference functions (:mod:`derive.reference`): a family's case's."""
    dv = derivation(name)
    return dv.case(**params) if isinstance(dv, FamilyDerivation) else (dv, params)


@lru_cache(maxsize=None)
def derivation(name: str):
    if name in BUILTIN_MAPS:
        return derive_map(BUILTIN_MAPS[name]())
    if name in FAMILY_MAPS:
        return FamilyDerivation(FAMILY_MAPS[name]())
    return derive_map(Regularizer.from_string(USER[name], name=name))


@contextmanager
def importable_map(folder, text: str, name: str, parameters=()):
    """The module ``regattn generate --expr text --name name`` writes (with ``parameters`` declared), written into
    ``folder`` and imported; importable by its name while the context lasts (:func:`derive.testing.generated_map`)."""
    from derive.testing import generated_map

    with generated_map(Regularizer.from_string(text, name=name, parameters=parameters), name, folder) as module:
        yield module


@contextmanager
def importable_user_maps(folder):
    """Write the user maps into ``folder`` with the same generator as `regattn generate --expr` and make them
    importable while the context lasts."""
    for name in USER:
        (folder / f"{name}.py").write_text(generate_module(derivation(name), name))
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="session", autouse=True)
def user_modules(tmp_path_factory):
    with importable_user_maps(tmp_path_factory.mktemp("usermaps")) as folder:
        yield folder


def hard_rows(x):
    """``x`` (at least 8 rows of at least 4 scores, a NumPy or torch array) with hard rows written in: row 1 a
    masked score, 2 fully masked, 3 a NaN, 4 constant, 5 ties at the top, 6 a wide spread, 7 a large offset
    with a tiny spread.  Returns ``x``."""
    x[1, 3] = -math.inf
    x[2] = -math.inf
    x[3, 0] = math.nan
    x[4] = 1.0
    x[5, :4] = 2.0
    x[6] *= 100
    x[7] = x[7] * 1e-3 + 1e6
    return x


def numpy_routines(module, params=(), **replaced):
    """``module``'s routines bound to ``params`` as :func:`numeric.core.rules.solve` takes them on NumPy arrays
    (the table of :mod:`numeric.numpy.backend`); ``replaced``: routines to swap in (``None`` hides one, e.g.
    ``link_scale=None`` makes a power-form link take the rules' generic path)."""
    from numeric import contract
    from numeric.core.ops import Routines

    table = {name: getattr(module, name, None) for name in contract.routine_names(module.PARAMETERS)}
    table.update(replaced)
    return Routines(module, table, tuple(params))


def counting_ops(dtype):
    """NumPy's row operations (:class:`numeric.numpy.ops.NumpyRowOps`) that record the rounds of each
    ``repeat_rows`` loop (those of its slowest row) in ``.rounds``, the rows still going before each round and
    after the last in ``.live`` (a list per loop), and the rows each ``sort_desc`` sorts in ``.sorted_rows``."""
    from numeric.numpy.ops import NumpyRowOps

    class Counting(NumpyRowOps):
        def __init__(self, dtype):
            super().__init__(dtype)
            self.rounds = []
            self.live = []
            self.sorted_rows = []

        def repeat_rows(self, n, body, state, going, rows=(), tail=False):
            count = [0]
            live = [int(going.sum())]

            def counted(state, rows):
                count[0] += 1
                state, going = body(state, rows)
                live.append(int(going.sum()))
                return state, going

            out = super().repeat_rows(n, counted, state, going, rows, tail)
            self.rounds.append(count[0])
            self.live.append(live)
            return out

        def sort_desc(self, x):
            self.sorted_rows.append(x.shape[0])
            return super().sort_desc(x)

    return Counting(dtype)


@pytest.fixture
def halley_forms(monkeypatch):
    """The power form given to each safeguarded Halley solve of :mod:`numeric.core` (``None``: the generic
    path), recorded while the test runs."""
    from numeric.core import halley, kkt, rules

    forms = []
    root_halley = halley.root_halley

    def spy(ops, r, y, steps, power, lo, hi, start=None):
        forms.append(power)
        return root_halley(ops, r, y, steps, power, lo, hi, start)

    for caller in (rules, kkt):  # (the root rule's and the KKT solve's fallback)
        monkeypatch.setattr(caller, "root_halley", spy)
    return forms


@pytest.fixture
def piece_solves(monkeypatch):
    """The exponent ``k`` of each power-form solve by Newton on the piece of the root between two kinks
    (``numeric.core.rules._power_piece_newton``: ``k < 1`` on rows of a known length), recorded while the test
    runs."""
    from numeric.core import rules

    ks = []
    solve = rules._power_piece_newton

    def spy(ops, a, k, y, lo, steps):
        ks.append(k)
        return solve(ops, a, k, y, lo, steps)

    monkeypatch.setattr(rules, "_power_piece_newton", spy)
    return ks


def reference(name: str, row, digits: int = 30, **params):
    params = params or PARAMS.get(name, {})
    return [float(v) for v in derivation(name).evaluate(list(map(float, row)), digits=digits, **params)]


ALPHA = sp.Symbol("alpha")


def record_shapes(monkeypatch, owner, name: str):
    """``(fn, shapes)``: ``owner.name`` (a solve ``(ops, r, y, steps, **options)``) as it was, and the list of the
    shapes of the rows ``y`` it is called with from now on (the function is replaced by a recording one)."""
    fn, shapes = getattr(owner, name), []

    def recording(ops, r, y, steps, **options):
        shapes.append(y.shape)
        return fn(ops, r, y, steps, **options)

    monkeypatch.setattr(owner, name, recording)
    return fn, shapes
