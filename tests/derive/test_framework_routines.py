"""The routines of every generated map module run on torch and JAX arrays (:func:`numeric.contract.routines_on`).

The torch and JAX maps run the module's NumPy code with ``numpy`` bound to the
framework's namespace.  Each framework's routines are compared with the NumPy
functions at random points inside their domains (float64, to a few ulps: the
same expressions, the frameworks' own libm); every NumPy name a generated module
calls must exist in both namespaces, and the ones torch spells differently
(``pow``, a cube root it lacks, ``erf``) must agree with NumPy's.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from derive import Regularizer, derive_map, generate_module
from derive.codegen import verify as V
from derive.codegen.files import load_module
from numeric import contract

from .test_codegen import ALL_MAPS, derivation_for, module_for


@pytest.fixture(autouse=True)
def _float64_jax():
    """JAX in float64 for the length of each test (its default is float32)."""
    if importlib.util.find_spec("jax") is None:
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def _table(target, module):
    return importlib.import_module(f"numeric.{target}.maps").routine_table(module)


def _framework(target):
    if target == "torch":
        torch = pytest.importorskip("torch")
        return lambda a: torch.tensor(np.asarray(a, dtype=np.float64)), lambda v: np.asarray(torch.as_tensor(v, dtype=torch.float64))
    pytest.importorskip("jax")
    import jax.numpy as jnp

    return lambda a: jnp.asarray(np.asarray(a, dtype=np.float64)), lambda v: np.asarray(v, dtype=np.float64)


def _points(dv, fname, rng, count=25):
    """Random arguments and parameters of ``fname`` inside its domain, as verify draws them."""
    uniform = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    integer = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    out = []
    for _ in range(20 * count):
        drawn = V.sample_point(dv, fname, uniform, integer, "double")
        if drawn is not None:
            out.append(drawn)
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("target", list(contract.FRAMEWORKS))
@pytest.mark.parametrize("name", ALL_MAPS)
def test_framework_routines_equal_the_numpy_routines(name, target):
    to_array, to_numpy = _framework(target)
    module, dv = module_for(name), derivation_for(name)
    table = _table(target, module)
    params = [q.symbol.name for q in dv.parameters]
    assert list(table) == list(contract.routine_names(params))
    rng = np.random.default_rng(0)
    checked = 0
    for fname in table:
        numpy_fn = getattr(module, fname)
        assert (table[fname] is None) == (numpy_fn is None), fname
        if numpy_fn is None:
            continue
        if fname not in V.functions(dv):  # a constant verify does not sample (clip = -inf of a dense map)
            np.testing.assert_equal(to_numpy(table[fname](*[to_array(1.5)] * len(params))), numpy_fn(*[1.5] * len(params)))
            continue
        for args, ps in _points(dv, fname, rng):
            want = np.asarray(numpy_fn(*[np.array([a]) for a in args], *ps), dtype=np.float64)
            got = to_numpy(table[fname](*[to_array([a]) for a in args], *[to_array(q) for q in ps]))
            np.testing.assert_allclose(np.broadcast_to(got, want.shape), want, rtol=64 * np.finfo(float).eps, atol=1e-300,
                                       err_msg=f"{name}.{fname}{tuple(args)} params {ps}")
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("target", list(contract.FRAMEWORKS))
def test_every_numpy_name_of_the_modules_exists_on_each_framework(target):
    """The names the generated modules call as ``numpy.NAME`` resolve in the framework's namespace."""
    _framework(target)
    module = importlib.import_module(f"numeric.{target}.maps")
    namespace = module.TORCH_AS_NUMPY if target == "torch" else importlib.import_module("jax.numpy")
    names = set()
    for name in ALL_MAPS:
        text = Path(module_for(name).__file__).read_text()
        names |= set(re.findall(r"\bnumpy\.(\w+)", text.split("TRITON_SOURCE")[0]))
    assert {"exp", "log", "power", "expm1"} <= names  # the modules were read
    missing = sorted(n for n in names if not hasattr(namespace, n))
    assert not missing, f"{target} lacks {missing}"


@pytest.mark.parametrize("target", list(contract.FRAMEWORKS))
def test_a_cube_root_runs_on_each_framework(tmp_path, target):
    """omega = p**(4/3) (alpha-entmax at 4/3): its link and weight hold cube roots; torch has none, its
    namespace defines one, real for negative arguments too."""
    to_array, to_numpy = _framework(target)
    dv = derive_map(Regularizer.from_string("p**(4/3)", name="cube_root"))
    path = tmp_path / "cube_root.py"
    path.write_text(generate_module(dv, "cube_root"))
    module = load_module(path)
    table = _table(target, module)
    source = path.read_text()
    assert "numpy.cbrt(p)" in source[source.index("def omega_prime"):source.index("def omega_second")]
    assert "numpy.cbrt(p)" in source[source.index("def weight_d2"):source.index("def clip")]
    for fname in ("omega_prime", "weight_d2"):  # the routines printed with cbrt (checked above)
        for v in (-3.0, -0.2, 0.0, 0.4, 2.5):  # NumPy's cbrt is real for negative arguments: so is the framework's
            want = np.asarray(getattr(module, fname)(np.array([v])), dtype=np.float64)
            got = to_numpy(table[fname](to_array([v])))
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300, err_msg=f"{fname}({v})")
