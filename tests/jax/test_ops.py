"""``JaxOps.on_rows``: the masked rows only, a chunk at a time, against computing every row and selecting."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from numeric.jax._ops import ON_ROWS_CHUNK, ops_for  # noqa: E402
from numeric.core.ops import TensorOps  # noqa: E402


def _fn(x, scale):
    # a row-wise function of the rows and of a number (a parameter the same for every row)
    return jnp.concatenate([jnp.cumsum(x, axis=-1) * scale, x.max(-1, keepdims=True)], axis=-1)


@given(rows=st.integers(1, 3 * ON_ROWS_CHUNK + 5), marked=st.data())
def test_on_rows_is_fn_where_masked(rows, marked):
    picks = marked.draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 6)), jnp.float32)
    mask = jnp.asarray(picks)[:, None]
    otherwise = jnp.full((rows, 7), -5.0, jnp.float32)
    ops = ops_for(jnp.float32)
    got = jax.jit(lambda x, m: ops.on_rows(m, _fn, (x, 2.0), otherwise))(x, mask)
    want = TensorOps.on_rows(ops, mask, _fn, (x, 2.0), otherwise)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_on_rows_under_vmap():
    ops = ops_for(jnp.float32)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 2 * ON_ROWS_CHUNK + 3, 5)), jnp.float32)
    mask = x[..., :1] > 0.5
    otherwise = jnp.zeros(x.shape[:-1] + (6,), jnp.float32)
    got = jax.vmap(lambda x, m, o: ops.on_rows(m, _fn, (x, 1.0), o))(x, mask, otherwise)
    want = jnp.where(mask, _fn(x, 1.0), otherwise)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_kkt_fallback_costs_no_memory_where_no_row_asks(tmp_path):
    """The KKT solve's fallback (safeguarded Halley with the link inverted: large temporaries) runs on chunks of
    rows: the jitted solve's temporaries on (512, 1024) float32 scores stay within a few times its input's,
    where selecting among all rows took 36 MB (17 times; above glibc's largest heap block, a fresh mapping
    of pages at every call, which took 10.4 ms a call where the solve took 4.7)."""
    from derive import Regularizer, derive_map, generate_module
    from derive.codegen.files import load_module
    from numeric.core import kkt
    from numeric.core.ops import Routines
    from numeric.jax.maps import routine_table

    path = tmp_path / "plogp_cube_ops.py"
    path.write_text(generate_module(derive_map(Regularizer.from_string("p*log(p) + p**3", name="plogp_cube_ops")),
                                    "plogp_cube_ops"))
    module = load_module(path)
    ops = ops_for(jnp.float32)
    r = Routines(module, routine_table(module), ())
    y = jnp.zeros((512, 1024), jnp.float32)
    compiled = jax.jit(lambda y: kkt._kkt_newton(ops, r, y, kkt.KKT_STEPS)).lower(y).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 8 * y.nbytes
