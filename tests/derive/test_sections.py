"""The PyTorch and JAX sections of every generated map module: the NumPy routines, printed for each framework.

Each section's routines are compared with the module's NumPy functions at random
points inside their domains (float64, to a few ulps: the same expressions, the
frameworks' own libm), and the printers' spellings are checked where the
frameworks differ from NumPy (torch.pow, a cube root torch lacks, erf).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import sympy as sp

from derive import Regularizer, derive_map, generate_module
from derive.codegen import verify as V
from derive.codegen.files import load_module
from derive.codegen.printers import JaxPrinter, TorchPrinter
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


@pytest.mark.parametrize("target", list(contract.SECTIONS))
@pytest.mark.parametrize("name", ALL_MAPS)
def test_section_routines_equal_the_numpy_routines(name, target):
    to_array, to_numpy = _framework(target)
    module, dv = module_for(name), derivation_for(name)
    table = getattr(module, contract.SECTIONS[target])()
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


def test_printers_spell_what_the_frameworks_spell_differently():
    x = sp.Symbol("x", positive=True)
    assert TorchPrinter().doprint(x**sp.Symbol("a")) == "torch.pow(x, a)"
    assert JaxPrinter().doprint(x**sp.Symbol("a")) == "jnp.power(x, a)"
    assert TorchPrinter().doprint(sp.atan(x)) == "torch.arctan(x)"
    assert TorchPrinter().doprint(sp.erf(x)) == "torch.special.erf(x)"


@pytest.mark.parametrize("target", list(contract.SECTIONS))
def test_a_cube_root_prints_for_each_framework(tmp_path, target):
    """omega = p**(4/3) (alpha-entmax at 4/3): its link and weight hold cube roots; torch has none, the
    section defines it, for negative arguments too."""
    to_array, to_numpy = _framework(target)
    dv = derive_map(Regularizer.from_string("p**(4/3)", name="cube_root"))
    path = tmp_path / "cube_root.py"
    path.write_text(generate_module(dv, "cube_root"))
    module = load_module(path)
    table = getattr(module, contract.SECTIONS[target])()
    source = path.read_text()
    section = source[source.index(f"def {contract.SECTIONS[target]}"):]
    assert "cbrt(p)" in section[section.index("def omega_prime"):section.index("def omega_second")]
    assert "cbrt(p)" in section[section.index("def weight_d2"):section.index("def clip")]
    if target == "torch":
        assert "def cbrt(x):" in section
    for fname in ("omega_prime", "weight_d2"):  # the routines printed with cbrt (checked above)
        assert f"def {fname}(p):" in section
        for v in (-3.0, -0.2, 0.0, 0.4, 2.5):  # NumPy's cbrt is real for negative arguments: so is the section's
            want = np.asarray(getattr(module, fname)(np.array([v])), dtype=np.float64)
            got = to_numpy(table[fname](to_array([v])))
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300, err_msg=f"{fname}({v})")
