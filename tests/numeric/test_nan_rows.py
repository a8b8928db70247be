"""The JVP of a NaN row (the output of a row with a NaN score) is NaN, as the row itself."""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm

from .conftest import MAPS


@pytest.mark.parametrize(("name", "params"), [
    pytest.param(n, p, marks=pytest.mark.xfail(strict=True, reason=(
        "sparsemax's weight is the constant 1: Map._on_support evaluates it at NaN + 1 and multiplies by the "
        "support mask 0, which gives 0 where the other maps' weights give NaN * 0 = NaN")) if n == "sparsemax" else ())
    for n, p in MAPS if n != "softmax"] + [("softmax", {})])
def test_jvp_of_a_nan_row_is_nan(name, params):
    m = nm.get_map(name, **params)
    p = m(np.array([[0.3, np.nan, -1.0, 2.0]]))
    assert np.isnan(p).all()
    assert np.isnan(m.jvp(p, np.ones_like(p))).all()
