"""Box constraints on numeric.jax (``0 <= p <= upper``, ``sum p = total``): the maps, their JVP and gradients in the
scores, the bounds, the total and alpha, the Fenchel-Young loss, attention with ``upper=``, errors, and unbounded
calls as they were.

Truths: the NumPy maps and loss (:mod:`numeric.maps`, themselves tested against the mpmath reference
:mod:`derive.box` to 1e-12), central differences of those in float64, ``jax.test_util.check_grads``, and a direct
NumPy computation of attention.  Shapes are small and shared, so few programs compile.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import numeric as nm  # noqa: E402
from numeric.jax import JaxMap, attention, entmax, fenchel_young_loss, get_map, softmax, sparsemax  # noqa: E402

INF = math.inf

MAPS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6}), ("entmax", {"alpha": 1.3}),
        ("shannon_gini", {})]
IDS = [name + "".join(f"-{k}{v}" for k, v in params.items()) for name, params in MAPS]
#: one alpha per row on either side of 1 (the family's routines solve them together) for the rows of `_rows`
ALPHA_ROWS = np.array([[0.8], [1.3]])


def _along_axis(seed=0):
    """Scores ``(2, 6, 3)`` along axis 1 with a masked score, bounds of the scores' shape (some infinite) and totals
    of size 1 along the axis; every row can hold its total."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, 3)) * 1.5
    x[1, 4, 2] = -INF
    upper = rng.choice([0.15, 0.3, 0.6, INF], size=x.shape)
    upper[:, :2] = 0.5
    total = np.array([[[0.8, 1.0, 0.6]], [[0.9, 0.7, 1.0]]])
    return x, upper, total


def _rows():
    """Two rows with a saturated bound each, away from kinks (no entry at 0 or at its bound by a hair); a target
    inside the box, off its bounds, with sums exact in binary."""
    x = np.array([[2.0, 0.3, 0.2, -0.4, 0.1], [1.5, 0.4, 0.45, -1.0, 0.0]])
    upper = np.array([[0.35, 0.3, 1.0, 1.0, INF], [0.3, 0.25, 0.3, 1.0, 0.3]])
    total = np.array([[0.875], [1.0]])
    y = np.array([[0.25, 0.25, 0.125, 0.125, 0.125], [0.25, 0.125, 0.25, 0.25, 0.125]])
    return x, upper, total, y


def _close(a, b, atol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, equal_nan=True)


def _central(f, args, tangents, h=1e-6):
    """The central difference of ``f`` along ``tangents`` at ``args`` (NumPy float64)."""
    up = [a + h * t for a, t in zip(args, tangents)]
    down = [a - h * t for a, t in zip(args, tangents)]
    return (np.asarray(f(*up)) - np.asarray(f(*down))) / (2 * h)


# ------------------------------------------------------- values and JVPs
@pytest.mark.parametrize(("name", "params"), MAPS, ids=IDS)
def test_values_and_jvp_match_numpy(name, params):
    """The map along an axis and its tangent along a random direction of (scores, bounds, total): the NumPy map's
    values, and the central difference of the NumPy map."""
    x, upper, total = _along_axis()
    m, jm = nm.get_map(name, **params), JaxMap(name, **params)
    rng = np.random.default_rng(3)
    tangents = (rng.standard_normal(x.shape), rng.standard_normal(x.shape), rng.standard_normal(total.shape))

    def f(x, u, c):
        return jm(x, axis=1, upper=u, total=c)

    p, dp = jax.jvp(f, tuple(jnp.asarray(a) for a in (x, upper, total)), tuple(jnp.asarray(t) for t in tangents))
    want = m(x, axis=1, upper=upper, total=total)
    assert p.dtype == jnp.float64
    _close(p, want)
    assert np.all(np.asarray(p) <= upper) and p[1, 4, 2] == 0
    _close(p.sum(axis=1, keepdims=True), total)
    _close(dp, _central(lambda x, u, c: m(x, axis=1, upper=u, total=c), (x, upper, total), tangents), atol=1e-7)
    _close(dp.sum(axis=1, keepdims=True), tangents[2])  # (the total moves the sum)


@pytest.mark.parametrize(("name", "params"), [MAPS[0], MAPS[3]], ids=[IDS[0], IDS[3]])
def test_float32_is_close_to_float64(name, params):
    x, upper, total = _along_axis()
    p32 = JaxMap(name, **params)(jnp.asarray(x, jnp.float32), axis=1, upper=upper, total=total)  # (NumPy bounds too)
    assert p32.dtype == jnp.float32
    _close(np.asarray(p32, np.float64), nm.get_map(name, **params)(x, axis=1, upper=upper, total=total), atol=3e-6)


def test_unbounded_calls_are_unchanged():
    x, _, _, _ = _rows()
    x = jnp.asarray(x)
    m = JaxMap("sparsemax")
    plain = m(x)
    for kw in ({"upper": None}, {"total": 1.0}, {"total": 1}, {"upper": None, "total": 1.0}):
        assert np.array_equal(m(x, **kw), plain)  # (the plain path, not a box with no binding bound)
    labels = jnp.asarray([0, 3])
    assert np.array_equal(fenchel_young_loss(x, labels, m, upper=None, total=1.0), fenchel_young_loss(x, labels, m))
    _close(m(x, upper=INF), plain, atol=1e-14)  # a bound that does not bind: the box path, the plain map's values


# ------------------------------------------------------------- derivatives
@pytest.mark.parametrize(("name", "params", "f"), [("softmax", {}, softmax), ("entmax", {"alpha": 1.3},
                                                                             lambda x, **kw: entmax(x, 1.3, **kw))],
                         ids=["softmax", "entmax-alpha1.3"])
def test_vjp_equals_numpy(name, params, f):
    """Reverse mode (the JVP transposed) in the scores, the bounds and the total, of the map functions: NumPy's
    ``vjp`` and ``vjp_bounds``."""
    x, upper, total, _ = _rows()
    m = nm.get_map(name, **params)
    p, pull = jax.vjp(lambda x, u, c: f(x, upper=u, total=c), *(jnp.asarray(a) for a in (x, upper, total)))
    dy = np.random.default_rng(4).standard_normal(x.shape)
    gx, gu, gc = pull(jnp.asarray(dy))
    want = m.vjp_bounds(np.asarray(p), dy, upper=upper, total=total)
    _close(gx, m.vjp(np.asarray(p), dy, upper=upper, total=total))
    _close(gu, want["upper"])
    _close(gc[:, 0], want["total"])
    assert np.all(np.asarray(gu)[:, 0] != 0)  # entry 0 saturates in both rows


def test_alpha_per_row_on_both_sides_of_one():
    """alpha per row, 0.8 (dense) and 1.3 (sparse): concrete values in two cases run the family's routines (as the
    plain map does), the NumPy map each value's case.  Values, the JVP in (scores, bounds, total, alpha) against
    central differences, and the gradient in alpha."""
    x, upper, total, _ = _rows()
    a0 = ALPHA_ROWS
    rng = np.random.default_rng(5)
    tangents = (rng.standard_normal(x.shape), rng.standard_normal(x.shape), rng.standard_normal(total.shape),
                rng.standard_normal(a0.shape))
    finite = np.isfinite(upper)

    def f(x, u, c, a):  # (an infinite bound stays infinite: its finite stand-in moves nothing)
        return entmax(x, a, upper=jnp.where(finite, u, INF), total=c)

    def ref(x, u, c, a):
        return nm.entmax(x, a, upper=np.where(finite, u, INF), total=c)

    args = (x, np.where(finite, upper, 5.0), total, a0)
    p, dp = jax.jvp(f, tuple(jnp.asarray(a) for a in args), tuple(jnp.asarray(t) for t in tangents))
    _close(p, ref(*args))
    _close(dp, _central(ref, args, tangents), atol=1e-7)
    dy = rng.standard_normal(x.shape)
    g = jax.grad(lambda a: (f(*(jnp.asarray(b) for b in args[:3]), a) * dy).sum())(jnp.asarray(a0))
    for i in range(2):
        e = np.zeros(a0.shape)
        e[i] = 1.0
        assert abs(float(g[i, 0]) - float(_central(lambda a: (ref(*args[:3], a) * dy).sum(), (a0,), (e,)))) < 1e-7


def test_scalar_alpha_and_bounds_in_a_broadcast_shape():
    """A number's gradient is the sum over the rows; bounds and totals broadcast to the scores get the sums over
    their broadcast entries: against central differences of the NumPy map."""
    x = _along_axis(5)[0][:, :, :2]  # (2, 6, 2) along axis 1
    upper = np.array([0.3, 0.5, 0.25, 0.6, 0.35, 0.4]).reshape(6, 1)  # per score, shared by the columns and examples
    total = np.array([[[0.9, 0.8]]])  # per column
    alpha = np.asarray(1.3)
    dy = np.random.default_rng(6).standard_normal(x.shape)

    def loss(u, c, a):
        return (entmax(jnp.asarray(x), a, axis=1, upper=u, total=c) * dy).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(*(jnp.asarray(a) for a in (upper, total, alpha)))
    args = (upper, total, alpha)
    for k, (a, g) in enumerate(zip(args, grads)):
        assert g.shape == a.shape
        for i in np.ndindex(a.shape):
            tangents = [np.zeros(b.shape) for b in args]
            tangents[k][i] = 1.0
            fd = _central(lambda u, c, a: (nm.entmax(x, float(a), axis=1, upper=u, total=c) * dy).sum(), args, tangents)
            assert abs(float(np.asarray(g)[i]) - float(fd)) < 1e-8


def test_check_grads_of_the_map_to_second_order():
    x, upper, total, _ = _rows()
    finite = np.isfinite(upper)
    jm = JaxMap("entmax15")

    def f(x, u, c):  # (an infinite bound stays infinite: its finite stand-in moves nothing)
        return jm(x, upper=jnp.where(finite, u, INF), total=c)

    check_grads(f, tuple(jnp.asarray(a) for a in (x, np.where(finite, upper, 5.0), total)), order=2, modes=["rev"])


# --------------------------------------------------------------- transforms
def test_jit_vmap_and_traced_infeasible_rows():
    x, upper, total, _ = _rows()
    args = tuple(jnp.asarray(a) for a in (x, upper, total))
    m, jm = nm.get_map("entmax15"), JaxMap("entmax15")
    want = m(x, upper=upper, total=total)
    f = jax.jit(lambda x, u, c: jm(x, upper=u, total=c))
    _close(f(*args), want)
    _close(jax.vmap(lambda x, u, c: jm(x, upper=u, total=c))(*args), want)  # (one row at a time)
    dy = np.random.default_rng(8).standard_normal(x.shape)
    gx, gu, gc = jax.jit(jax.grad(lambda x, u, c: (jm(x, upper=u, total=c) * dy).sum(), argnums=(0, 1, 2)))(*args)
    _close(gx, m.vjp(want, dy, upper=upper, total=total))
    _close(gu, m.vjp_bounds(want, dy, upper=upper, total=total)["upper"])
    # traced bounds cannot be read: a row they cannot fill is NaN, the other rows are the map
    short = upper.copy()
    short[1] = 0.1
    got = np.asarray(f(args[0], jnp.asarray(short), args[2]))
    assert np.all(np.isnan(got[1]))
    _close(got[0], want[0])


# --------------------------------------------------------------------- loss
LOSS_MAPS = [MAPS[0], MAPS[1], MAPS[3], MAPS[5]]


@pytest.mark.parametrize(("name", "params"), LOSS_MAPS, ids=[IDS[i] for i in (0, 1, 3, 5)])
def test_loss_and_gradients_match_numpy(name, params):
    """The loss and its gradients in the scores, the bounds and the total against ``numeric.Map.loss_and_grad(...,
    bounds=True)``; distributions and labels."""
    x, upper, total, y = _rows()
    m, jm = nm.get_map(name, **params), get_map(name, **params)

    def loss(x, u, c, y, reduction):
        return fenchel_young_loss(x, y, jm, reduction, upper=u, total=c)

    args = tuple(jnp.asarray(a) for a in (x, upper, total))
    labels = np.array([0, 2])
    u1 = np.where(np.arange(5) == labels[:, None], 1.0, upper)  # (room for the label's 1)
    for target, u, c, reduction in ((y, upper, total, "sum"), (labels, u1, np.ones((2, 1)), "mean")):
        value, grad, bounds = m.loss_and_grad(x, target, upper=u, total=c, reduction=reduction, bounds=True)
        got, (gx, gu, gc) = jax.value_and_grad(loss, argnums=(0, 1, 2))(args[0], jnp.asarray(u), jnp.asarray(c),
                                                                        jnp.asarray(target), reduction)
        _close(got, value)
        _close(gx, grad)
        _close(gu, bounds["upper"], atol=1e-10)
        _close(gc[:, 0], bounds["total"], atol=1e-10)


def test_loss_second_derivatives():
    """The loss's gradients ``(p - y, mu, tau)`` differentiated along a random direction of (scores, bounds,
    total), against central differences of NumPy's (``Map.loss_and_grad(..., bounds=True)``; under jit: a moved
    total leaves the target outside the box, which an eager call refuses); and check_grads to second order in the
    scores and bounds."""
    x, upper, total, y = _rows()
    m, jm = nm.get_map("entmax15"), get_map("entmax15")
    finite = np.isfinite(upper)

    def loss(x, u, c):  # (an infinite bound stays infinite: its finite stand-in is not moved)
        return fenchel_young_loss(x, jnp.asarray(y), jm, "sum", upper=jnp.where(finite, u, INF), total=c)

    def grads(x, u, c):  # (p, mu, tau): the gradients less the target, which moves with the total to stay inside
        yc = y * c / total
        _, gx, bounds = m.loss_and_grad(x, yc, upper=np.where(finite, u, INF), total=c, reduction="sum", bounds=True)
        return np.concatenate([gx + yc, bounds["upper"], bounds["total"][:, None]], axis=1)

    rng = np.random.default_rng(7)
    args = (x, np.where(finite, upper, 5.0), total)
    tangents = (rng.standard_normal(x.shape), rng.standard_normal(x.shape) * finite, rng.standard_normal(total.shape))
    _, dg = jax.jvp(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), tuple(jnp.asarray(a) for a in args),
                    tuple(jnp.asarray(t) for t in tangents))
    _close(np.concatenate(dg, axis=1), _central(grads, args, tangents), atol=1e-8)
    check_grads(jax.jit(lambda x, u: loss(x, u, jnp.asarray(total))), tuple(jnp.asarray(a) for a in args[:2]),
                order=2, modes=["rev"])


def test_loss_alpha_gradient_per_row():
    """The envelope theorem's gradient in alpha per row (0.8 and 1.3) against central differences of NumPy's loss."""
    x, upper, total, y = _rows()

    def loss(a):
        return fenchel_young_loss(jnp.asarray(x), jnp.asarray(y), get_map("entmax", alpha=a), "sum", upper=upper,
                                  total=total)

    g = jax.grad(loss)(jnp.asarray(ALPHA_ROWS))
    assert g.shape == ALPHA_ROWS.shape
    for i in range(2):
        e = np.zeros(ALPHA_ROWS.shape)
        e[i] = 1.0
        fd = _central(lambda a: nm.get_map("entmax", alpha=a).loss(x, y, upper=upper, total=total, reduction="sum"),
                      (ALPHA_ROWS,), (e,))
        assert abs(float(g[i, 0]) - float(fd)) < 1e-8


# ---------------------------------------------------------------- attention
def _qkv(seed, B=2, T=4, S=5, N=2, K=1, H=3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, T, N, H)), rng.normal(size=(B, S, K, H)), rng.normal(size=(B, S, K, 2))


def _numpy_attention(q, k, v, name, upper, mask=None, causal=False, scale=0.8):
    """The scores, masked, the NumPy map with the bounds along the keys, times the values (heads of ``K`` repeated)."""
    N, K = q.shape[2], k.shape[2]
    k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) * scale
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        keep = keep & np.tril(np.ones(s.shape[-2:], bool))
    s = np.where(keep, s, -INF)
    p = nm.get_map(name)(s, axis=-1, upper=np.broadcast_to(upper, s.shape))
    return np.einsum("bnts,bsnh->btnh", p, v)


def _bounds(seed, shape=(2, 4, 5)):
    """Bounds per head, query and key (``(N, T, S)``) that every causal row can fill: the first key's above 1."""
    u = np.random.default_rng(seed).uniform(0.25, 0.7, size=shape)
    u[..., 0] = 1.5
    return u


def test_attention_with_bounds_equals_numpy():
    name = "sparsemax"
    q, k, v = _qkv(8)
    qkv = tuple(jnp.asarray(a) for a in (q, k, v))
    upper = _bounds(9)
    mask = np.ones((2, 1, 4, 5), bool)
    mask[0, 0, 2, 3:] = False
    want = _numpy_attention(q, k, v, name, upper, mask=mask, causal=True)
    for block in (None, 3):  # one block; blocks of 3 query rows (the last padded)
        got = attention(*qkv, mask=jnp.asarray(mask), is_causal=True, scale=0.8, mapping=name,
                        upper=jnp.asarray(upper), block_size=block)
        _close(got, want)
    # a bound shared by every query (size 1 along T), and a number
    shared = _bounds(10, (1, 1, 5))
    _close(attention(*qkv, scale=0.8, mapping=name, upper=jnp.asarray(shared)), _numpy_attention(q, k, v, name, shared))
    _close(attention(*qkv, scale=0.8, mapping=name, upper=0.3), _numpy_attention(q, k, v, name, 0.3))


def test_attention_gradient_in_the_bounds():
    """The gradient of a weighted sum of the outputs in the bounds (in blocks: sliced and padded with the query
    rows) against central differences of the NumPy computation entry by entry."""
    q, k, v = _qkv(11)
    upper = _bounds(12)
    w = np.random.default_rng(13).normal(size=(2, 4, 2, 2))
    qkv = tuple(jnp.asarray(a) for a in (q, k, v))
    fd = np.zeros(upper.shape)
    for i in np.ndindex(upper.shape):
        e = np.zeros(upper.shape)
        e[i] = 1.0
        fd[i] = _central(lambda u: (_numpy_attention(q, k, v, "sparsemax", u, causal=True) * w).sum(), (upper,), (e,))
    assert np.count_nonzero(fd) > 0  # some weights sit at their bounds
    g = jax.grad(lambda u: (attention(*qkv, is_causal=True, scale=0.8, mapping="sparsemax", upper=u,
                                      block_size=3) * w).sum())(jnp.asarray(upper))
    _close(g, fd, atol=1e-8)


def test_attention_infeasible_and_fully_masked_rows():
    """Bounds a query's visible keys cannot fill: refused where readable (eager, one block), as the NumPy and torch
    attention do; traced, a NaN row; a fully masked query's weights 0, eager or traced."""
    q, k, v = _qkv(14)
    qkv = tuple(jnp.asarray(a) for a in (q, k, v))
    mask = np.ones((2, 2, 4, 5), bool)
    mask[1, 0, 3] = False  # query 3 of example 1, head 0: no key

    def f(u, mask=None):
        return attention(*qkv, mask=mask, is_causal=True, scale=0.8, mapping="sparsemax", upper=u)

    # a causal first row sees one key: a bound of 0.4 cannot hold its weight 1
    with pytest.raises(ValueError, match="infeasible bounds: in row 0 .* sum to 0.4 < total = 1"):
        f(0.4)
    eager = np.asarray(f(_bounds(15), jnp.asarray(mask)))
    assert np.all(eager[1, 3, 0] == 0)  # a fully masked query: zeros, as without bounds (it was refused)
    got = np.asarray(jax.jit(f)(jnp.asarray(0.4), jnp.asarray(mask)))
    assert np.all(np.isnan(got[:, :2])) and np.all(np.isfinite(got[:, 2:]))  # rows 0, 1 see one and two keys
    assert np.all(got[1, 3, 0] == 0)
    # the other rows against NumPy's (with the rows it refuses made feasible: they are not compared)
    live, ub = mask.copy(), np.full((4, 5), 0.4)
    live[1, 0, 3], ub[:2] = True, 1.0
    want = _numpy_attention(q, k, v, "sparsemax", ub, mask=live, causal=True)
    compared = np.ones(got.shape[:3], bool)  # (B, T, N)
    compared[:, :2], compared[1, 3, 0] = False, False
    _close(got[compared], want[compared])


# ------------------------------------------------------------------- errors
def test_errors_name_the_argument():
    x, upper, total, y = (jnp.asarray(a) for a in _rows())
    with pytest.raises(ValueError, match=r"infeasible bounds: in row 1 .* sum to 0.9 < total = 1"):
        sparsemax(jnp.zeros((2, 3)), upper=jnp.asarray([[0.5], [0.3]]))
    with pytest.raises(ValueError, match="infeasible"):  # a masked score's bound does not count
        softmax(jnp.asarray([[0.0, -INF]]), upper=0.6)
    with pytest.raises(ValueError, match="upper must be >= 0"):
        sparsemax(x, upper=jnp.asarray([1.0, -1.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="total must be finite and"):
        sparsemax(x, total=-1.0)
    with pytest.raises(ValueError, match="total must be finite and"):
        sparsemax(x, total=jnp.asarray([[1.0], [INF]]))
    with pytest.raises(ValueError, match="upper of shape .* does not broadcast"):
        sparsemax(x, upper=jnp.ones(4))
    with pytest.raises(ValueError, match="must have size 1 along axis"):
        sparsemax(x, total=jnp.ones((2, 5)))
    with pytest.raises(TypeError, match="upper must be a real number or a real array"):
        sparsemax(x, upper="1")
    with pytest.raises(ValueError, match="summing to its total"):
        fenchel_young_loss(x, y, "sparsemax", upper=upper, total=1.0)
    with pytest.raises(ValueError, match="within the upper bounds"):
        fenchel_young_loss(x, y, "sparsemax", upper=jnp.where(jnp.isfinite(upper), 0.2, INF), total=total)
    q, k, v = (jnp.asarray(a) for a in _qkv(15))
    with pytest.raises(TypeError, match="upper must be a floating-point array"):
        attention(q, k, v, upper=jnp.ones((4, 5), jnp.int32))
    with pytest.raises(ValueError, match=r"upper of shape \(1, 1, 3, 5\) does not broadcast to the scores' shape"):
        attention(q, k, v, upper=jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="upper must be >= 0"):
        attention(q, k, v, upper=-1.0)
