"""The "where to add" recipes of docs/architecture.md, carried out in a temporary folder.

Each test does what a contributor following the recipe would: a new
regularizer (from text, generated into a folder of its own, loaded by name),
a new backend (a module defining a :class:`numeric.backend.Backend` for an
array type of its own, registered, then used by every map through the same
front end), and a new score function (a module defining a
:class:`numeric.summaries.ScoreFunction`, used by attention and a layer, its
parameter's gradient checked by finite differences).
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
