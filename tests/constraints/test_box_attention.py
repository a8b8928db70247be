"""Attention with bounds on its weights (``attention(..., upper=)``) on every backend (NumPy, torch, JAX), and the
torch layer's ``upper=``: the outputs, the gradients in the queries, keys, values, bounds and alpha per head,
infeasible and fully masked rows, errors.

Truths: the bounded NumPy map applied to the masked scores directly (itself checked against :mod:`derive.box` in
test_box.py), and central differences of NumPy's attention for every gradient (NumPy's ``attention_backward``,
torch's autograd and JAX's transforms alike); the frameworks' own gradient checks.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import numeric as nm
from tests.backends import backend_params
from tests.constraints.cases import qkv

INF = np.inf
EVERY = backend_params()
AUTODIFF = backend_params("autodiff")


def _inputs(seed=0, L=6, S=6):
    """``q, k, v`` in ``(batch, heads, length, dim)`` and bounds per head, query and key, ``(2, L, S)``."""
    q, k, v, rng = qkv(seed, L, S)
    upper = rng.uniform(0.3, 0.8, (2, L, S))
    return q, k, v, upper


def _direct(q, k, v, name, upper, mask=None, causal=False, scale=None):
    """The bounded NumPy map of the masked scores, times the values (heads of ``k`` and ``v`` broadcast)."""
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        keep = keep & np.tril(np.ones(s.shape[-2:], bool))
    p = nm.get_map(name)(np.where(keep, s, -INF), upper=np.broadcast_to(upper, s.shape))
    return p @ v, p


def _attend(backend, q, k, v, name, upper, **keywords):
    """``backend.attention`` with NumPy arrays in and out (``upper`` a number or an array)."""
    upper = backend.array(upper) if isinstance(upper, np.ndarray) else upper
    mask = keywords.pop("mask", None)
    out = backend.attention(backend.array(q), backend.array(k), backend.array(v), name, upper=upper,
                            mask=None if mask is None else backend.array(mask), **keywords)
    return backend.numpy(out)


def _grads(backend, q, k, v, dout, mapping, upper, is_causal=False, block=None):
    """The gradients of ``sum(dout * attention(q, k, v, upper=))`` in ``q``, ``k``, ``v`` and ``upper`` as NumPy
    arrays: NumPy's ``attention_backward(..., param_grads=True)``, the others' autodiff."""
    if backend.name == "numpy":
        dq, dk, dv, grads = nm.attention_backward(q, k, v, dout, mapping=mapping, upper=upper, causal=is_causal,
                                                  block=block, param_grads=True)
        return dq, dk, dv, grads["upper"]

    def f(q, k, v, u):
        out = backend.attention(q, k, v, mapping, is_causal=is_causal, block=block, upper=u)
        return (out * backend.array(dout)).sum()

    return backend.grad(f, *(backend.array(a) for a in (q, k, v, upper)))


def _central(f, a, h=1e-6):
    """The gradient of the scalar ``f`` at ``a`` by central differences."""
    out = np.zeros(a.shape)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        out[i] = (f(up) - f(down)) / (2 * h)
    return out


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "shannon_gini"])
@pytest.mark.parametrize("block", [None, 2])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_outputs_are_the_bounded_map_of_the_scores(backend, name, block):
    q, k, v, upper = _inputs()
    mask = np.ones((6, 6), dtype=bool)
    mask[:, 5] = False
    want, p = _direct(q, k, v, name, upper, mask=mask)
    np.testing.assert_allclose(_attend(backend, q, k, v, name, upper, mask=mask, block=block), want, rtol=0,
                               atol=1e-14)
    if backend.name == "numpy":  # (the weights it returns)
        out, w = nm.attention(q, k, v, mapping=name, upper=upper, mask=mask, block=block, return_weights=True)
        np.testing.assert_allclose(w, p, rtol=0, atol=1e-15)
        assert np.all(w <= upper + 1e-15)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_causal_rows_shared_heads_and_broadcast_bounds(backend):
    """Causal rows with a mask and bounds they can fill, in blocks of 2 and 3 query rows (the last padded); keys and
    values of one head shared by both query heads; a bound shared by every query (size 1 along the queries) and a
    number."""
    q, k, v, _ = _inputs(1)
    upper = np.full((6, 6), 0.5)
    upper[0, 0] = 1.0  # query 0 sees key 0 alone
    mask = np.ones((2, 1, 6, 6), bool)
    mask[0, 0, 2, 1:] = False
    for block in (None, 2, 3):
        got = _attend(backend, q, k, v, "entmax15", upper, is_causal=True, block=block)
        np.testing.assert_allclose(got, _direct(q, k, v, "entmax15", upper, causal=True)[0], rtol=0, atol=1e-14)
    k1, v1 = k[:, :1], v[:, :1]
    bounds = np.random.default_rng(9).uniform(0.25, 0.7, (2, 6, 6))
    bounds[..., 0] = 1.5  # (every causal row can fill its total)
    for block in (None, 3):
        got = _attend(backend, q, k1, v1, "sparsemax", bounds, mask=mask, is_causal=True, block=block)
        want = _direct(q, k1, v1, "sparsemax", bounds, mask=mask, causal=True)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    shared = np.random.default_rng(10).uniform(0.25, 0.7, (1, 1, 6))
    for u in (shared, 0.3):
        np.testing.assert_allclose(_attend(backend, q, k1, v1, "sparsemax", u),
                                   _direct(q, k1, v1, "sparsemax", np.asarray(u))[0], rtol=0, atol=1e-12)


def _gradient_case(causal: bool):
    """``q, k, v, upper, dout`` of :func:`test_gradients_are_central_differences` (causal: the first key's bound
    1.5, so that every causal row can fill its total)."""
    q, k, v, upper = _inputs(2, L=4, S=5)
    if causal:
        upper = np.concatenate([np.full((2, 4, 1), 1.5), upper[..., 1:]], -1)
    return q, k, v, upper, np.random.default_rng(3).standard_normal((2, 2, 4, 3))


@lru_cache(maxsize=None)
def _attention_central(name: str, causal: bool):
    """Central differences of ``sum(dout * attention(...))`` (NumPy's) in ``q``, ``k``, ``v`` and ``upper`` for
    :func:`_gradient_case` (computed once for every backend)."""
    q, k, v, u, dout = _gradient_case(causal)

    def loss(**kw):
        a = {"q": q, "k": k, "v": v, "upper": u, **kw}
        return (nm.attention(a["q"], a["k"], a["v"], mapping=name, upper=a["upper"], causal=causal) * dout).sum()

    return tuple(_central(lambda b, key=key: loss(**{key: b}), a) for key, a in zip(("q", "k", "v", "upper"),
                                                                                    (q, k, v, u)))


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_gradients_are_central_differences(backend, name):
    """In the queries, keys, values and bounds, in blocks of 2 query rows, and causal in blocks of 3 (the last
    padded): against central differences of NumPy's attention."""
    for causal, block in ((False, 2), (True, 3)):
        q, k, v, u, dout = _gradient_case(causal)
        got = _grads(backend, q, k, v, dout, name, u, is_causal=causal, block=block)
        for g, a, fd in zip(got, (q, k, v, u), _attention_central(name, causal)):
            assert g.shape == a.shape
            np.testing.assert_allclose(g, fd, rtol=0, atol=1e-8)
        assert np.abs(got[3]).max() > 0.1  # some bounds bind


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_alpha_per_head_across_one_with_bounds(backend):
    q, k, v, upper = _inputs(4, L=4, S=5)
    dout = np.random.default_rng(5).standard_normal((2, 2, 4, 3))
    alpha = np.array([[[0.8]], [[1.4]]])  # per head

    def loss(a):
        return (nm.attention(q, k, v, mapping=nm.get_map("entmax", alpha=a), upper=upper) * dout).sum()

    if backend.name == "numpy":
        *_, grads = nm.attention_backward(q, k, v, dout, mapping=nm.get_map("entmax", alpha=alpha), upper=upper,
                                          param_grads=True)
        got = grads["map"]["alpha"]
    else:
        qkv = tuple(backend.array(a) for a in (q, k, v))
        got = backend.grad(lambda a: (backend.attention(*qkv, backend.get_map("entmax", alpha=a),
                                                        upper=backend.array(upper)) * backend.array(dout)).sum(),
                           backend.array(alpha))
    np.testing.assert_allclose(got, _central(loss, alpha), rtol=0, atol=1e-7)


@pytest.mark.parametrize("backend", AUTODIFF, indirect=True)
def test_gradient_check_in_the_queries_bounds_and_alpha(backend):
    """Blocked (each block recomputed in the backward) and in one block, with bounds, queries and alpha per head."""
    q, k, v, upper = _inputs(7, L=3, S=4)
    k, v = backend.array(k[:1]), backend.array(v[:1])
    for block in (None, 2):
        def f(q, u, a):
            return backend.attention(q, k, v, backend.get_map("entmax", alpha=a), block=block, upper=u)

        backend.check_grads(f, backend.array(q[:1]), backend.array(upper), backend.array(np.array([[[0.8]], [[1.4]]])),
                            order=1, reverse_only=True)


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_infeasible_and_fully_masked_rows(backend):
    """Bounds a query's visible keys cannot fill are refused by name (a causal first row sees one key: a bound of
    0.4 cannot hold its weight 1); a fully masked query's weights are 0, with bounds as without."""
    q, k, v, upper = _inputs(14, L=4, S=5)
    with pytest.raises(ValueError, match=r"infeasible bounds: in row 0 .* sum to 0.4 < total = 1"):
        _attend(backend, q, k, v, "sparsemax", 0.4, is_causal=True)
    mask = np.ones((2, 2, 4, 5), bool)
    mask[1, 0, 3] = False  # query 3 of example 1, head 0: no key
    bounds = upper[:, :, :5].copy()
    bounds[..., 0] = 1.5
    got = _attend(backend, q, k, v, "sparsemax", bounds, mask=mask, is_causal=True)
    assert np.all(got[1, 0, 3] == 0)
    live = mask.copy()
    live[1, 0, 3] = True
    want = _direct(q, k, v, "sparsemax", bounds, mask=live, causal=True)[0]
    compared = np.ones(got.shape[:3], bool)
    compared[1, 0, 3] = False
    np.testing.assert_allclose(got[compared], want[compared], rtol=0, atol=1e-12)
    x = np.zeros((1, 3, 2))
    keep = np.array([[False, False, False], [True, True, True], [True, True, True]])  # query 0 sees no key
    out = _attend(backend, x[None], x[None], np.ones((1, 1, 3, 2)), "softmax", 0.6, mask=keep)
    np.testing.assert_array_equal(out[0, 0, 0], 0)


@pytest.mark.parametrize("backend", backend_params("jit"), indirect=True)
def test_traced_infeasible_rows_are_nan(backend):
    """Traced bounds cannot be read: a row they cannot fill is NaN, a fully masked one 0, the others the map."""
    q, k, v, _ = _inputs(14, L=4, S=5)
    mask = np.ones((2, 2, 4, 5), bool)
    mask[1, 0, 3] = False
    qkv = tuple(backend.array(a) for a in (q, k, v))
    f = backend.jit(lambda u, m: backend.attention(*qkv, "sparsemax", is_causal=True, mask=m, upper=u))
    got = backend.numpy(f(backend.array(np.asarray(0.4)), backend.array(mask)))
    assert np.all(np.isnan(got[:, :, :2])) and np.all(np.isfinite(got[:, :, 2:]))  # rows 0, 1 see one and two keys
    assert np.all(got[1, 0, 3] == 0)
    live, ub = mask.copy(), np.full((4, 5), 0.4)
    live[1, 0, 3], ub[:2] = True, 1.0
    want = _direct(q, k, v, "sparsemax", ub, mask=live, causal=True)[0]
    compared = np.ones(got.shape[:3], bool)
    compared[:, :, :2], compared[1, 0, 3] = False, False
    np.testing.assert_allclose(got[compared], want[compared], rtol=0, atol=1e-12)


#: what each backend says of a mapping that is a plain function (it has no bounded solve)
NOT_A_MAP = {"numpy": "a map is a name, a generated module or a Map", "torch": "upper= needs a regattn map",
             "jax": "mapping must be a map name"}


@pytest.mark.parametrize("backend", EVERY, indirect=True)
def test_errors_name_the_argument(backend):
    q, k, v, upper = _inputs()
    with pytest.raises(ValueError, match=r"upper of shape .* broadcast to the scores' shape"):
        _attend(backend, q, k, v, "softmax", np.ones((3, 6, 6)))
    with pytest.raises(ValueError, match=r"upper must be >= 0"):
        _attend(backend, q, k, v, "softmax", -1.0)
    with pytest.raises(ValueError, match="infeasible bounds"):
        _attend(backend, q, k, v, "softmax", 0.5, is_causal=True)
    with pytest.raises(TypeError, match=NOT_A_MAP[backend.name]):
        _attend(backend, q, k, v, lambda s, *args, **kw: s, upper)
    if backend.name != "numpy":  # (NumPy takes integer bounds as numbers; the frameworks want floating tensors)
        with pytest.raises(TypeError, match="upper must be a .*floating"):
            _attend(backend, q, k, v, "softmax", np.ones((6, 6), np.int32))


@pytest.mark.parametrize("backend", backend_params(only=("torch",)), indirect=True)
def test_layer_takes_bounds(backend):
    """``MultiheadAttention(..., mapping=...)(x, x, x, upper=)``: the weights it returns lie in the box and are the
    bounded map of the layer's scores; the output agrees with and without the weights; the bounds get gradients."""
    from numeric.torch.layers import MultiheadAttention

    torch, rt = backend.torch, backend.rt
    torch.manual_seed(0)
    layer = MultiheadAttention(8, 2, mapping="sparsemax", batch_first=True, bias=False).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    upper = torch.full((5, 5), 0.4, dtype=torch.float64, requires_grad=True)
    out, w = layer(x, x, x, upper=upper, average_attn_weights=False)
    again, _ = layer(x, x, x, upper=upper, need_weights=False)
    torch.testing.assert_close(out, again, rtol=0, atol=1e-14)
    assert torch.all(w <= 0.4 + 1e-15)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5, dtype=torch.float64), rtol=0, atol=1e-14)
    qw, kw, _ = layer.in_proj_weight.chunk(3)
    heads = lambda a: a.reshape(3, 5, 2, 4).transpose(1, 2)  # noqa: E731
    s = heads(x @ qw.T) @ heads(x @ kw.T).transpose(-1, -2) / 2
    torch.testing.assert_close(w, rt.sparsemax(s, upper=upper), rtol=0, atol=1e-14)
    (g,) = torch.autograd.grad(again.square().sum(), upper)
    assert g.abs().max() > 0
    per_head = torch.full((3 * 2, 5, 5), 0.4, dtype=torch.float64)
    torch.testing.assert_close(layer(x, x, x, upper=per_head, need_weights=False)[0], again, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="upper must have shape"):
        layer(x, x, x, upper=torch.ones(4, 5, 5, dtype=torch.float64))
