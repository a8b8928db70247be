"""``get_map`` and the maps of every backend (NumPy, torch, JAX): what they accept (a name, a generated module, a map,
rebound with parameters) and what they refuse, and how they say it: each message written once and checked on every
backend (``dim`` in torch's messages where the others say ``axis``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.backends import backend_params

EVERY = backend_params()


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_get_map_accepts_a_name_a_module_and_a_map(backend):
    import numeric._generated.sparsemax as module

    x = backend.array([1.0, 0.5, -1.0])
    for mapping in ("sparsemax", module, backend.get_map("sparsemax")):
        assert np.array_equal(backend.numpy(backend.call(backend.get_map(mapping), x)), [0.75, 0.25, 0.0])
    rebound = backend.get_map(backend.get_map("entmax", alpha=1.5), alpha=2.0)
    np.testing.assert_allclose(backend.numpy(backend.call(rebound, x)), [0.75, 0.25, 0.0], rtol=0, atol=1e-15)
    assert backend.get_map(backend.get_map("entmax", alpha=1.2)).params == {"alpha": 1.2}
    assert backend.get_map("cube").name == "cube"


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors_name_the_argument(backend):
    x = backend.array(np.random.default_rng(27).normal(size=(2, 3)))

    def entmax(x, alpha, axis=-1):
        return backend.call(backend.get_map("entmax", alpha=alpha), x, axis)

    softmax = backend.get_map("softmax")
    word = backend.axis_word
    ints = backend.array(np.arange(6).reshape(2, 3))
    if backend.name == "numpy":  # NumPy computes integer scores in float64
        assert backend.call(softmax, ints).dtype == np.float64
    else:
        with pytest.raises(TypeError, match="scores must be a floating"):
            backend.call(softmax, ints)
    with pytest.raises(ValueError, match=rf"{word} 2 is out of range for scores of shape \(2, 3\)"):
        backend.call(softmax, x, 2)
    with pytest.raises(ValueError, match=r"at least one dimension, got shape \(\)"):
        backend.call(softmax, backend.array(1.0))
    with pytest.raises(ValueError, match=rf"{word} -1 of scores with shape \(2, 0\) is empty"):
        backend.call(softmax, backend.array(np.ones((2, 0))))
    with pytest.raises(ValueError, match=r"parameter alpha = 0.0 is outside \(0.0, inf\)"):
        entmax(x, 0.0)
    with pytest.raises(ValueError, match="parameter alpha = -0.5 is outside"):
        entmax(x, backend.array([[1.5], [-0.5]]))
    with pytest.raises(ValueError, match=rf"parameter alpha of shape \(2, 3\) must have size 1 along {word}"):
        entmax(x, backend.array(np.full((2, 3), 1.5)))
    with pytest.raises(ValueError, match="parameter alpha .* does not broadcast"):
        entmax(x, backend.array(np.full((5, 1), 1.5)))
    with pytest.raises(TypeError, match="parameter alpha must be a real number"):
        entmax(x, "1.5")
    with pytest.raises(ValueError, match=r"has no parameter\(s\) \['beta'\]"):
        backend.get_map("entmax", beta=1.0)
    with pytest.raises(ValueError, match="needs a value for alpha"):
        backend.call(backend.get_map("entmax"), x)
    with pytest.raises(ValueError, match="threshold must be one of"):
        backend.get_map("softmax", threshold="closed-form")
    with pytest.raises(ValueError, match="'sort' needs a link of degree 1 or 2"):
        backend.get_map("softmax", threshold="sort")
    with pytest.raises(TypeError, match="a map is a name, a generated module or a"):
        backend.get_map(3.0)
    with pytest.raises(TypeError, match="not a generated map"):
        backend.get_map(math)


@pytest.mark.parametrize("name, closest", [("entmax1.5", "entmax15"), ("sparsmax", "sparsemax")])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_a_misspelt_map_name_lists_the_builtins_and_the_closest(backend, name, closest):
    with pytest.raises(ValueError, match="no map named") as info:
        backend.get_map(name)
    message = str(info.value)
    assert f"no map named {name!r} (did you mean {closest!r}?): built-ins are softmax, sparsemax, entmax15" in message
