"""What NumPy's ``MultiHeadAttention`` and torch's ``MultiheadAttention`` share, each property written once: a
learned alpha per head is the map with those alphas, head by head; sparse maps give sparse weights on the simplex,
and the output without the weights is the output with them; a query that may attend to no key outputs the output
projection's bias.

The two layers' interfaces differ by design (torch's is ``torch.nn.MultiheadAttention``'s, NumPy's a module with
``forward`` and ``backward``), so each is driven through a small adapter (``LAYERS``); what each has of its own is
tested in tests/numeric/test_layers.py and tests/torch/test_layers*.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import numeric as nm


class NumpyLayer:
    def __init__(self, embed, heads, mapping, learn_alpha=False, seed=0):
        self.layer = nm.MultiHeadAttention(embed, heads, mapping=mapping, dtype="float64", seed=seed,
                                           learn=("alpha",) if learn_alpha else ())

    @staticmethod
    def get_map(name, alpha=None):
        return nm.get_map(name) if alpha is None else nm.get_map(name, alpha=alpha)

    def set_alpha_logits(self, logits):
        self.layer.params["alpha_logit"] = np.asarray(logits, np.float64)

    def alphas(self):
        return np.asarray(self.layer.map_params()["alpha"])

    def copy_weights_from(self, other):
        for name, a in other.layer.params.items():
            if name in self.layer.params:
                self.layer.params[name] = a.copy()

    def set_out_bias(self, values):
        self.layer.params["out_bias"] = np.asarray(values, np.float64)

    def __call__(self, x, mask=None, need_weights=True):
        """``(output, weights per head or None)``; ``mask`` ``(L, S)``, True where a query may attend."""
        y = self.layer.forward(x, mask=mask, need_weights=need_weights)
        return y, self.layer.attention_weights


class TorchLayer:
    def __init__(self, embed, heads, mapping, learn_alpha=False, seed=0):
        self.torch = pytest.importorskip("torch")
        from numeric.torch.layers import MultiheadAttention

        self.torch.manual_seed(seed)
        self.layer = MultiheadAttention(embed, heads, dtype=self.torch.float64, mapping=mapping,
                                        learn=("alpha",) if learn_alpha else (), batch_first=True)

    @staticmethod
    def get_map(name, alpha=None):
        import torch

        from numeric.torch import get_map

        if alpha is None:
            return get_map(name)
        return get_map(name, alpha=torch.as_tensor(alpha) if isinstance(alpha, np.ndarray) else alpha)

    def set_alpha_logits(self, logits):
        with self.torch.no_grad():
            self.layer.alpha_logit.copy_(self.torch.as_tensor(logits))

    def alphas(self):
        return self.layer.alpha.detach().numpy()

    def copy_weights_from(self, other):
        self.layer.load_state_dict(other.layer.state_dict(), strict=False)

    def set_out_bias(self, values):
        with self.torch.no_grad():
            self.layer.out_proj.bias.copy_(self.torch.as_tensor(values))

    def __call__(self, x, mask=None, need_weights=True):
        attn_mask = None if mask is None else self.torch.as_tensor(~mask)  # (torch's True: may not attend)
        out, w = self.layer(*(self.torch.as_tensor(x),) * 3, attn_mask=attn_mask, need_weights=need_weights,
                            average_attn_weights=False)
        return out.detach().numpy(), None if w is None else w.detach().numpy()


LAYERS = [pytest.param(NumpyLayer, id="numpy"), pytest.param(TorchLayer, id="torch")]


@pytest.mark.parametrize("Layer", LAYERS)
def test_learned_alpha_per_head_is_the_map_with_those_alphas(Layer):
    """Three heads with learned alphas on both sides of 1 and above 2: the layer equals one whose map has those
    alphas fixed per head (shape (H, 1, 1)), the same weights; with and without the attention weights."""
    learned = Layer(6, 3, Layer.get_map("entmax", alpha=1.5), learn_alpha=True, seed=41)
    learned.set_alpha_logits([-1.0, 0.0, 2.0])
    alphas = learned.alphas()
    assert alphas[0] < 1 < alphas[1] < 2 < alphas[2]
    fixed = Layer(6, 3, Layer.get_map("entmax", alpha=alphas.reshape(3, 1, 1)), seed=7)
    fixed.copy_weights_from(learned)
    x = np.random.default_rng(41).standard_normal((2, 4, 6))
    for need_weights in (True, False):
        (a, wa), (b, wb) = learned(x, need_weights=need_weights), fixed(x, need_weights=need_weights)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
        if need_weights:
            np.testing.assert_allclose(wa, wb, rtol=0, atol=1e-14)
    for h, alpha in enumerate(alphas):  # head by head: the map at that head's alpha alone
        plain = Layer(6, 3, Layer.get_map("entmax", alpha=float(alpha)), seed=7)
        plain.copy_weights_from(learned)
        np.testing.assert_allclose(plain(x)[1][:, h], learned(x)[1][:, h], rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["entmax15", "sparsemax"])
@pytest.mark.parametrize("Layer", LAYERS)
def test_sparse_maps_give_sparse_weights(Layer, name):
    layer = Layer(8, 2, name, seed=50)
    x = 4 * np.random.default_rng(50).standard_normal((2, 7, 8))
    out, w = layer(x)
    assert w.shape == (2, 2, 7, 7) and (w == 0).any() and (w >= 0).all()
    np.testing.assert_allclose(w.sum(-1), 1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(layer(x, need_weights=False)[0], out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("Layer", LAYERS)
def test_a_query_that_sees_no_key_outputs_the_bias(Layer):
    layer = Layer(8, 2, "entmax15", seed=3)
    bias = np.random.default_rng(3).standard_normal(8)
    layer.set_out_bias(bias)
    x = np.random.default_rng(4).standard_normal((1, 3, 8))
    mask = np.array([[True, True, True], [False, False, False], [True, False, True]])
    for need_weights in (True, False):
        out, _ = layer(x, mask=mask, need_weights=need_weights)
        assert np.array_equal(out[0, 1], bias) and np.isfinite(out).all()
