"""The "where to add" recipes of docs/architecture.md, carried out in a temporary folder.

Each test does what a contributor following the recipe would: a new
regularizer (from text, generated into a folder of its own, loaded by name),
a new backend (a module defining a :class:`numeric.backend.Backend` for an
array type of its own, registered, then used by every map through the same
front end), a new score function (a module defining a
:class:`numeric.summaries.ScoreFunction`, used by attention and a layer, its
parameter's gradient checked by finite differences), a new constraint set and a
new map family (a class each, registered in its table, run by every front end).
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

import numeric as nm
from derive import derive_map
from derive.cli import main
from numeric import backends as B
from numeric.constraints import ConstraintSet
from numeric.families import Family


def test_recipe_a_new_regularizer(tmp_path, monkeypatch, capsys):
    """regattn generate --expr ... --name ... --out DIR, then numeric.get_map("NAME") with DIR on sys.path."""
    assert main(["generate", "--expr", "p**3/3 + p*log(p)/2", "--name", "toy_reg", "--out", str(tmp_path)]) == 0
    monkeypatch.syspath_prepend(str(tmp_path))
    m = nm.get_map("toy_reg")
    x = np.array([[0.3, -1.0, 0.8, 0.1], [2.0, 2.0, -3.0, 0.0]])
    from derive import Regularizer

    dv = derive_map(Regularizer.from_string("p**3/3 + p*log(p)/2"))
    want = np.array([[float(v) for v in dv.evaluate(row.tolist(), digits=30)] for row in x])
    np.testing.assert_allclose(m(x), want, rtol=0, atol=1e-13)


TOY_BACKEND = '''
"""A toy backend: maps on ToyArray (a NumPy array of its own type) by plain bisection on tau."""

import numpy as np

from numeric.backend import Backend


class ToyArray(np.ndarray):
    pass


def clipped_link(module, z, params):
    """g_+(z): the module's link where z > omega'(0+) (module.clip), else 0.  (A map whose link has no
    closed form, module.link None, would invert omega' with numeric.newton.invert_link.)"""
    clip = module.clip(*params)
    live = z > clip
    # a base just below 0 by rounding: NaN; the base 0 at the clip: log1p(-1) in a link printed near a pole
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        g = module.link(np.where(live, z, clip), *params)
    return np.where(live & (g > 0), g, 0)


class ToyBackend(Backend):
    name = "toy"
    calls = 0

    def owns(self, array):
        return isinstance(array, ToyArray)

    def namespace(self):
        return np

    def forward(self, mapping, x, *, overwrite=False):
        type(self).calls += 1
        module, params = mapping.module, mapping.cast_params(x.dtype)
        m = x.max(axis=-1)
        y = x - m[:, None]
        lo = -module.omega_prime(np.ones(1), *params)[0] * np.ones(x.shape[0])
        count = np.isfinite(x).sum(axis=-1)
        hi = -module.omega_prime(1 / count, *params)
        for _ in range(200):  # F(t) = sum g_+(y - t) decreases in t; F(lo) >= 1 >= F(hi)
            mid = (lo + hi) / 2
            f = clipped_link(module, y - mid[:, None], params).sum(axis=-1)
            lo, hi = np.where(f >= 1, mid, lo), np.where(f >= 1, hi, mid)
        p = clipped_link(module, y - lo[:, None], params)
        return p / p.sum(axis=-1, keepdims=True), m + lo

    def jvp(self, mapping, y, dx):
        type(self).calls += 1
        w = np.where(y > 0, mapping.module.weight(np.where(y > 0, y, 1), *mapping.cast_params(y.dtype)), 0)
        return w * (dx - (w * dx).sum(-1, keepdims=True) / w.sum(-1, keepdims=True))
'''


@pytest.fixture
def toy_backend(tmp_path, monkeypatch):
    (tmp_path / "toy_backend.py").write_text(textwrap.dedent(TOY_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_backend")
    monkeypatch.setattr(B, "_registry", list(B.backends()))  # both restored after the test
    monkeypatch.setattr(B, "_defaults_only", B._defaults_only)
    B.register_backend(module.ToyBackend())
    yield module
    sys.modules.pop("toy_backend", None)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "entmax"])
def test_recipe_a_new_backend(toy_backend, name):
    """A registered backend serves every map through the same front end (axes, dtypes, masks, the loss)."""
    params = {"alpha": 1.7} if name == "entmax" else {}
    m = nm.get_map(name, **params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 4))
    x[0, 1, 2] = -np.inf
    toy = x.view(toy_backend.ToyArray)
    assert B.backend_for(toy).name == "toy" and B.backend_for(x).name == "numpy"
    before = toy_backend.ToyBackend.calls
    got = m(toy, axis=1)
    assert toy_backend.ToyBackend.calls == before + 1
    np.testing.assert_allclose(got, m(x, axis=1), rtol=0, atol=1e-12)
    dx = rng.standard_normal(x.shape)
    Toy = toy_backend.ToyArray
    np.testing.assert_allclose(m.jvp(got.view(Toy), dx.view(Toy), axis=1), m.jvp(m(x, axis=1), dx, axis=1),
                               rtol=0, atol=1e-10)
    assert toy_backend.ToyBackend.calls == before + 2
    with pytest.raises(TypeError, match="different backends"):
        m.jvp(got.view(Toy), dx, axis=1)  # one call, one backend
    # every constraint set runs on it with no code of its own: the set's solve and derivatives on the generic row
    # operations (numeric.core.array_ops.ArrayOps on the backend's namespace), NumPy's on NumPy's own
    upper = rng.uniform(0.2, 0.6, size=x.shape)
    from numeric.core.array_ops import ArrayOps

    assert type(B.backend_for(toy).row_ops(np.float64)) is ArrayOps
    bounded, plain = m(toy, axis=1, upper=upper), m(x, axis=1, upper=upper)
    np.testing.assert_allclose(bounded, plain, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.vjp_bounds(bounded.view(Toy), dx.view(Toy), axis=1, upper=upper, x=toy)["upper"],
                               m.vjp_bounds(plain, dx, axis=1, upper=upper, x=x)["upper"], rtol=0, atol=1e-12)


def test_a_backend_must_be_a_backend():
    with pytest.raises(TypeError, match="numeric.backend.Backend"):
        B.register_backend(object())


def test_recipe_a_new_builtin_map(tmp_path, monkeypatch, capsys):
    """A built-in map is one entry of derive.codegen.builtins.BUILTINS: generate writes it, the command takes its name."""
    from derive.codegen import builtins
    from derive.codegen.files import load_module

    monkeypatch.setattr(builtins, "BUILTINS", builtins.BUILTINS + (builtins.Builtin("entmax43", "tsallis", "4/3"),))
    assert main(["generate", "--out", str(tmp_path)]) == 0
    module = load_module(tmp_path / "entmax43.py")
    x = np.random.default_rng(1).standard_normal((4, 7))
    np.testing.assert_allclose(nm.get_map(module)(x), nm.entmax(x, 4 / 3), rtol=0, atol=1e-13)
    assert "entmax43" in (tmp_path / "__init__.py").read_text()
    capsys.readouterr()
    assert main(["derive", "entmax43"]) == 0 and "tsallis(alpha=4/3)" in capsys.readouterr().out


TOY_SCORES = '''
"""A toy score function: s_ij = -|q_i - k_j|^2 / (2 t^2), a Gaussian kernel of learnable width t."""

import numpy as np

from numeric.summaries import ScoreFunction


class Distance(ScoreFunction):
    def __init__(self, t):
        self.params = {"t": np.asarray(t, dtype=float)}

    def __call__(self, q, k):
        d = q[..., :, None, :] - k[..., None, :, :]
        return -(d * d).sum(-1) / (2 * self.params["t"] ** 2)

    def backward(self, q, k, ds):
        t = self.params["t"]
        d = q[..., :, None, :] - k[..., None, :, :]
        dd = -ds[..., None] * d / t**2  # d s / d q_i = -(q_i - k_j) / t^2
        dt = (ds * (d * d).sum(-1)).sum() / t**3
        return dd.sum(-2), -dd.sum(-3), {"t": np.asarray(dt)}

    def check(self, q, k):
        if q.shape[-1] != k.shape[-1]:
            raise ValueError("queries and keys must have the same features")
'''


def test_recipe_a_new_score_function(tmp_path, monkeypatch):
    """A ScoreFunction subclass in a module of its own: attention, attention_backward and the layers take it."""
    (tmp_path / "toy_scores.py").write_text(textwrap.dedent(TOY_SCORES))
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_scores")
    try:
        rng = np.random.default_rng(2)
        q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 2))
        f = toy.Distance(0.8)
        out, w = nm.attention(q, k, v, mapping="sparsemax", scores=f, causal=True, return_weights=True)
        s = -((q[:, :, None] - k[:, None]) ** 2).sum(-1) / (2 * 0.8**2)
        s = np.where(np.tri(4, 6, dtype=bool), s, -np.inf)
        np.testing.assert_allclose(w, nm.sparsemax(s), atol=1e-14)
        np.testing.assert_allclose(out, w @ v, atol=1e-14)
        dout = rng.standard_normal(out.shape)
        dq, dk, _, grads = nm.attention_backward(q, k, v, dout, mapping="softmax", scores=f, block=3, param_grads=True)

        def loss(t=0.8, q=q):
            return float((nm.attention(q, k, v, mapping="softmax", scores=toy.Distance(t)) * dout).sum())

        np.testing.assert_allclose(grads["scores"]["t"], (loss(0.8 + 1e-6) - loss(0.8 - 1e-6)) / 2e-6, rtol=1e-6)
        e = np.zeros_like(q)
        e[1, 2, 0] = 1e-6
        np.testing.assert_allclose(dq[1, 2, 0], (loss(q=q + e) - loss(q=q - e)) / 2e-6, rtol=1e-6)
        layer = nm.MultiHeadAttention(6, 2, mapping="entmax15", dtype="float64", seed=0, scores=toy.Distance(1.5))
        x, dy = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 6))
        layer.forward(x)
        layer.backward(dy)
        t0 = layer.params["scores_t"].copy()

        def layer_loss(t):
            layer.params["scores_t"] = np.asarray(t)
            return float((layer.forward(x) * dy).sum())

        np.testing.assert_allclose(layer.grads["scores_t"], (layer_loss(t0 + 1e-6) - layer_loss(t0 - 1e-6)) / 2e-6,
                                   rtol=1e-6)
    finally:
        sys.modules.pop("toy_scores", None)


class LowerBound(ConstraintSet):
    """A toy constraint set, ``p >= lower``, ``sum p = 1`` (``lower=``), written as the recipe "add a constraint
    set" says: one class on the row operations, registered in :data:`numeric.constraints.SETS`.

    ``p_i = max(l_i, g_+(s_i - tau))``: ``F(tau) = sum_i max(l_i, g_+(s_i - tau))`` decreases from at least 1
    (at ``tau = max(s) - omega'(1)``) to ``sum l < 1``; its root is bracketed by widening, then bisected, and the
    free entries (``p_i > l_i``) are scaled to the rest of the mass.  On the free entries the Jacobian is the
    simplex's; a bound held moves its entry one for one, the free ones giving way by ``w / sum w``.
    """

    name = "lower"
    keywords = {"lower": None}
    per_score = frozenset({"lower"})

    def asks(self, values):
        return values["lower"] is not None

    def rows(self, xp, arrays, x, values, axis, word="axis"):
        lower, n = values["lower"], x.shape[axis]
        if isinstance(lower, (int, float)):
            return (arrays.full((x.numel() // n if hasattr(x, "numel") else x.size // n, n), float(lower), x),)
        lower = arrays.astype(lower, x.dtype)
        return (xp.moveaxis(xp.broadcast_to(lower, tuple(x.shape)), axis, -1).reshape(-1, n),)

    def solve(self, ops, r, x, lower):
        from numeric.core.halley import clipped_link

        m = ops.row_max(x)
        y, clip = x - m, r.clip()

        def mass(t):
            g, _ = clipped_link(ops, r, y, t, clip)
            return g, ops.row_sum(ops.where(g > lower, g, lower))

        lo = -r.omega_prime(ops.full(m, 1.0))
        going = ops.full(m, True)

        def widen(state):
            lo, hi, _ = state
            over = mass(hi)[1] > 1
            return (ops.where(over, hi, lo), ops.where(over, hi + 2 * (hi - lo), hi), over), over

        lo, hi, _ = ops.repeat(64, widen, (lo, lo + 1, going), going)

        def bisect(state):
            lo, hi, _ = state
            mid = (lo + hi) / 2
            over = mass(mid)[1] > 1
            lo, hi = ops.where(over, mid, lo), ops.where(over, hi, mid)
            going = hi - lo > 4 * ops.eps * (1 + abs(hi))
            return (lo, hi, going), going

        lo, hi, _ = ops.repeat(400, bisect, (lo, hi, going), going)
        t = (lo + hi) / 2
        g, _ = mass(t)
        free = g > lower
        rest = 1 - ops.row_sum(ops.where(free, 0, lower))
        share = ops.row_sum(ops.where(free, g, 0))
        return ops.where(free, g * (rest / share), lower), m + t

    def _weights(self, ops, r, p, lower):
        from numeric.core.derivatives import weights

        free = p > lower
        return ops.where(free, weights(ops, r, p), 0), free

    def vjp(self, ops, r, p, v, lower, at_zero=None, x=None):
        w, free = self._weights(ops, r, p, lower)
        mean = ops.row_sum(w * v) / ops.row_sum(w)
        return w * (v - mean), (ops.where(free, 0, v - mean),)

    def jvp(self, ops, r, p, dx, tangents, lower, at_zero=None, x=None):
        (dl,) = tangents
        w, free = self._weights(ops, r, p, lower)
        held = ops.where(free, 0, dl + 0 * p)
        dtau = (ops.row_sum(w * dx) + ops.row_sum(held)) / ops.row_sum(w)
        return w * (dx - dtau) + held

    def moving(self, ops, p, lower):
        return p > lower


def _lower_bound_direct(m_numpy, x, lower):
    """The lower-bounded map by a direct solve in float64: bisection on tau with NumPy's own map routines."""
    module = m_numpy.module
    out = []
    for s, low in zip(x, lower):
        def mass(t):
            z = s - t
            g = np.where(z > module.clip(), module.link(np.maximum(z, module.clip())), 0)
            return np.maximum(g, low)

        lo, hi = s.max() - module.omega_prime(1.0) - 1, s.max() + 50
        for _ in range(300):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mass(mid).sum() > 1 else (lo, mid)
        out.append(mass((lo + hi) / 2))
    return np.array(out)


@pytest.fixture
def lower_bound(monkeypatch):
    """The toy set registered for one test (the table restored after it)."""
    from numeric.constraints import table

    monkeypatch.setattr(table, "SETS", list(table.SETS))
    monkeypatch.setattr(table, "KEYWORDS", dict(table.KEYWORDS))
    return table.register(LowerBound())


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_recipe_a_new_constraint_set(lower_bound, name):
    """A set added in one class (:class:`LowerBound`) runs on NumPy's, torch's and JAX's maps, with its
    gradients, and in NumPy's and torch's attention, against a direct solve and finite differences."""
    torch = pytest.importorskip("torch")
    import numeric.torch as nt

    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 6)) * 2
    lower = rng.uniform(0, 0.12, size=(4, 6))
    m = nm.get_map(name)
    want = _lower_bound_direct(m, x, lower)
    p = m(x, lower=lower)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-10)
    assert np.all(p >= lower - 1e-15) and np.allclose(p.sum(-1), 1, atol=1e-13)

    # torch: the same values, and gradients in the scores and the bounds against central differences
    tx = torch.tensor(x, requires_grad=True)
    tl = torch.tensor(lower, requires_grad=True)
    tp = nt.get_map(name)(tx, lower=tl)
    np.testing.assert_allclose(tp.detach().numpy(), want, rtol=0, atol=1e-10)
    dy = torch.tensor(rng.normal(size=x.shape))
    gx, gl = torch.autograd.grad((tp * dy).sum(), (tx, tl))
    h = 1e-6
    for i, j in ((0, 0), (1, 3), (2, 5)):
        e = np.zeros_like(x)
        e[i, j] = h
        fd_x = ((m(x + e, lower=lower) - m(x - e, lower=lower)) * dy.numpy()).sum() / (2 * h)
        fd_l = ((m(x, lower=lower + e) - m(x, lower=lower - e)) * dy.numpy()).sum() / (2 * h)
        assert abs(gx[i, j].item() - fd_x) < 1e-5 and abs(gl[i, j].item() - fd_l) < 1e-5
    # NumPy's VJP in the set's array, by the same protocol
    np.testing.assert_allclose(m.vjp_bounds(p, dy.numpy(), lower=lower)["lower"], gl.numpy(), rtol=0, atol=1e-12)

    # JAX: the values, and the JVP in the bounds against the torch VJP (forward and reverse mode agree)
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numeric.jax as nj

    with jax.enable_x64(True):
        jm = nj.get_map(name)
        jp = jm(jnp.asarray(x), lower=jnp.asarray(lower))
        np.testing.assert_allclose(np.asarray(jp), want, rtol=0, atol=1e-10)
        g = jax.grad(lambda low: jnp.sum(jm(jnp.asarray(x), lower=low) * jnp.asarray(dy.numpy())))(jnp.asarray(lower))
        np.testing.assert_allclose(np.asarray(g), gl.numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["softmax", "entmax15"])
def test_recipe_a_new_constraint_set_in_attention(lower_bound, name):
    """The toy set of :func:`test_recipe_a_new_constraint_set` in NumPy's and torch's attention, blocked, with no
    change to attention: the output against a direct solve of each query's weights, the gradient in the bounds
    (NumPy's backward, torch's autograd) against central differences."""
    torch = pytest.importorskip("torch")
    import numeric.torch as nt

    rng = np.random.default_rng(5)
    B, L, S, E = 2, 5, 7, 3
    q, k, v = rng.normal(size=(B, L, E)), rng.normal(size=(B, S, E)), rng.normal(size=(B, S, 2))
    lower = rng.uniform(0, 0.1, size=(B, L, S))
    m = nm.get_map(name)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(E)
    weights = _lower_bound_direct(m, scores.reshape(-1, S), lower.reshape(-1, S)).reshape(B, L, S)
    want = weights @ v
    np.testing.assert_allclose(nm.attention(q, k, v, mapping=name, block=2, lower=lower), want, rtol=0, atol=1e-10)
    tl = torch.tensor(lower, requires_grad=True)
    out = nt.attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), mapping=name, block=2, lower=tl)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=0, atol=1e-10)

    dout = rng.normal(size=want.shape)
    (g_torch,) = torch.autograd.grad((out * torch.tensor(dout)).sum(), (tl,))
    *_, grads = nm.attention_backward(q, k, v, dout, mapping=name, block=2, param_grads=True, lower=lower)
    np.testing.assert_allclose(grads["lower"], g_torch.numpy(), rtol=0, atol=1e-10)
    h = 1e-6
    for index in ((0, 0, 0), (1, 4, 6), (0, 2, 3)):
        e = np.zeros_like(lower)
        e[index] = h
        fd = ((nm.attention(q, k, v, mapping=name, lower=lower + e)
               - nm.attention(q, k, v, mapping=name, lower=lower - e)) * dout).sum() / (2 * h)
        assert abs(grads["lower"][index] - fd) < 1e-6


class ScaledSoftmax(Family):
    """A toy map family, ``p = softmax(c s)`` (``c > 0``), written as the recipe "add a family" says: one class on
    the row operations, registered in :data:`numeric.families.table.FAMILIES`.

    Its inner map is softmax at the scores ``c s``, and ``p`` is softmax's own; ``Omega(p) = (1/c) sum p log p``,
    so ``J = c (diag(p) - p p^T)`` and the Fenchel-Young loss is ``(1/c) (log sum exp(c s) + sum y log y) - <s, y>``.
    """

    name = "scaled_softmax"
    inner = "softmax"
    parameters = {"c": 1.0}
    domains = {"c": (0.0, np.inf)}
    summary = "softmax of the scores times ``c > 0``"
    sparse = False

    def scale(self, c):
        return c

    def output(self, ops, r, c):
        return r

    def vjp(self, ops, p, v, c):
        return c * (p * v - p * ops.row_sum(p * v))

    def loss(self, ops, x, p, y, c):
        s = x - ops.row_max(x)
        entropy = ops.row_sum(ops.where(y > 0, y * ops.log(ops.where(y > 0, y, 1)), 0))
        return (ops.log(ops.row_sum(ops.exp(c * s))) + entropy) / c - ops.row_sum(y * s)


@pytest.fixture
def scaled_softmax(monkeypatch):
    """The toy family registered for one test (the table restored after it)."""
    from numeric.families import table

    monkeypatch.setattr(table, "FAMILIES", dict(table.FAMILIES))
    return table.register(ScaledSoftmax())


def _scaled_softmax_direct(x, c):
    e = np.exp(c * (x - x.max(-1, keepdims=True)))
    return e / e.sum(-1, keepdims=True)


def test_recipe_a_new_family(scaled_softmax):
    """A family added in one class (:class:`ScaledSoftmax`) runs on NumPy's, torch's and JAX's maps, by name, with
    its JVP/VJP and its loss, against a direct computation and finite differences, and in NumPy's attention."""
    from numeric.families import functions

    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 6)) * 2
    c = np.array([[0.5], [1.0], [2.0], [3.5]])
    want = _scaled_softmax_direct(x, c)
    y = rng.dirichlet(np.ones(6), size=4)
    dy = rng.normal(size=x.shape)

    # NumPy: values (one c and one per row), the VJP against central differences, the loss against its closed form
    m = nm.get_map("scaled_softmax", c=c)
    assert (m.name, m.sparse, repr(nm.get_map("scaled_softmax"))) == \
        ("scaled_softmax", False, "Map('scaled_softmax', threshold='auto', c=1.0)")
    p = m(x)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(nm.get_map("scaled_softmax", c=2.0)(x.T, axis=0), _scaled_softmax_direct(x, 2.0).T,
                               rtol=0, atol=1e-15)
    np.testing.assert_array_equal(functions(nm.get_map, "axis", "numeric")["scaled_softmax"](x, c), p)
    h = 1e-6
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = ((m(x + e) - m(x - e)) * dy).sum() / (2 * h)
    np.testing.assert_allclose(m.vjp(p, dy), fd, rtol=0, atol=1e-9)
    np.testing.assert_allclose(m.jvp(p, dy), m.vjp(p, dy), rtol=0, atol=0)
    value, grad = m.loss_and_grad(x, y, reduction="none")
    lse = np.log(np.exp(c * x).sum(-1, keepdims=True)) / c
    np.testing.assert_allclose(value, (lse + (y * np.log(y)).sum(-1, keepdims=True) / c - (y * x).sum(-1, keepdims=True))[:, 0],
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(grad, p - y, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"scaled_softmax needs c > 0 \(finite\), got -1.0"):
        nm.get_map("scaled_softmax", c=-1.0)
    with pytest.raises(NotImplementedError, match="scaled_softmax has no gradient in c"):
        m.vjp_params(p, dy)
    with pytest.raises(ValueError, match="scaled_softmax takes no box constraints"):
        m(x, upper=0.5)
    q, k, v = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 2))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(3)
    np.testing.assert_allclose(nm.attention(q, k, v, mapping=nm.get_map("scaled_softmax", c=2.0), block=2),
                               _scaled_softmax_direct(s, 2.0) @ v, rtol=0, atol=1e-14)

    # torch: the same values, autograd's gradient in the scores against NumPy's VJP (and gradcheck), the loss
    torch = pytest.importorskip("torch")
    import numeric.torch as nt

    tx = torch.tensor(x, requires_grad=True)
    tc = torch.tensor(c)
    tm = nt.get_map("scaled_softmax", c=tc)
    tp = tm(tx)
    np.testing.assert_allclose(tp.detach().numpy(), want, rtol=0, atol=1e-15)
    (gx,) = torch.autograd.grad((tp * torch.tensor(dy)).sum(), tx)
    np.testing.assert_allclose(gx.numpy(), m.vjp(p, dy), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda z: tm(z), (tx,))
    assert torch.autograd.gradgradcheck(lambda z: tm(z), (tx,))
    loss = nt.fenchel_young_loss(tx, torch.tensor(y), tm, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), value, rtol=0, atol=1e-12)
    (gl,) = torch.autograd.grad(loss.sum(), tx)
    np.testing.assert_allclose(gl.numpy(), grad, rtol=0, atol=1e-15)
    with pytest.raises(RuntimeError, match="scaled_softmax has no gradient in c"):
        nt.get_map("scaled_softmax", c=tc.clone().requires_grad_())(tx).sum().backward()
    tq = torch.tensor(q, requires_grad=True)
    out = nt.attention(tq, torch.tensor(k), torch.tensor(v), mapping=nt.get_map("scaled_softmax", c=2.0), block=2)
    np.testing.assert_allclose(out.detach().numpy(), _scaled_softmax_direct(s, 2.0) @ v, rtol=0, atol=1e-14)
    dout = rng.normal(size=out.shape)
    (gq,) = torch.autograd.grad((out * torch.tensor(dout)).sum(), tq)
    dq, _, _ = nm.attention_backward(q, k, v, dout, mapping=nm.get_map("scaled_softmax", c=2.0))
    np.testing.assert_allclose(gq.numpy(), dq, rtol=0, atol=1e-13)

    # JAX: the values, jit, the JVP's transpose against NumPy's VJP, the loss's gradient p - y
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numeric.jax as nj

    with jax.enable_x64(True):
        jm = nj.get_map("scaled_softmax", c=jnp.asarray(c))
        np.testing.assert_allclose(np.asarray(jax.jit(lambda mm, z: mm(z))(jm, jnp.asarray(x))), want, rtol=0, atol=1e-15)
        g = jax.grad(lambda z: jnp.sum(jm(z) * jnp.asarray(dy)))(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(g), m.vjp(p, dy), rtol=0, atol=1e-14)
        jl = nj.fenchel_young_loss(jnp.asarray(x), jnp.asarray(y), jm, reduction="none")
        np.testing.assert_allclose(np.asarray(jl), value, rtol=0, atol=1e-12)
        g = jax.grad(lambda z: nj.fenchel_young_loss(z, jnp.asarray(y), jm, reduction="sum"))(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(g), grad, rtol=0, atol=1e-15)
        with pytest.raises(ValueError, match="scaled_softmax has no gradient in c"):
            jax.grad(lambda a: nj.get_map("scaled_softmax", c=a)(jnp.asarray(x)).sum())(2.0)
