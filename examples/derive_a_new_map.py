"""From a regularizer written as text to causal multi-head attention, in one script.

Run: python examples/derive_a_new_map.py   (writes derive_a_new_map.png and shannon_gini.tex)

1. omega(p) = p log p + p^2/2 (Shannon plus Gini) is parsed (never eval'd) and its
   map derived: the link is a LambertW, so the numeric side inverts omega' by Newton.
2. The derivation is printed, and written as LaTeX.
3. `regattn generate --expr ... --name shannon_gini --out DIR` writes the kernels; the
   module imports with plain Python and numeric.get_map accepts it.
4. What adding the Gini term to Shannon did, next to softmax (Shannon alone), 1.5-entmax
   and sparsemax, read off the derivation and seen for two scores s = [t, 0]:
   - it flattens the map: at t = 0 the slope dp_1/dt is w/2 with the Jacobian weight
     w = 1/omega''(1/2), which the derivation gives as 1/3 (softmax: 1/2), so p_1 rises with
     slope 1/6 instead of softmax's 1/4: a sum of regularizers regularizes more, and the same
     scores give more even weights;
   - it does not make the map sparse: sparsity is decided by omega'(0+) alone (step 5 of
     the derivation), -oo here as for softmax, so p_1 > 0 for every t, where sparsemax's
     p_1 is exactly 0 for t <= -1 and 1.5-entmax's for t <= -2.
5. The new map runs in causal multi-head attention (forward and backward) next to softmax
   and sparsemax. The picture's log colour scale shows step 4 in attention: softmax and
   shannon_gini give every allowed key a positive weight (down to 1e-9), sparsemax gives
   most keys exactly 0 (grey), and shannon_gini's largest weights are smaller than softmax's.
"""

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import sympy

import numeric as nm
from derive import Regularizer, derive_map, p

EXPR = "p*log(p) + p**2/2"
#: the maps compared with the new one: Shannon alone, and two sparse maps (finite omega'(0+))
PEERS = ("softmax", "entmax15", "sparsemax")


def two_scores(mapping, t):
    """p_1 for the scores s = [t, 0], one row per value of ``t``."""
    scores = np.stack([t, np.zeros_like(t)], axis=-1)
    return nm.get_map(mapping)(scores, axis=-1)[:, 0]


def slope_at_zero(mapping):
    """dp_1/dt at s = [0, 0] from the map's JVP (``w*v - w (w.v)/sum(w)``): w/2."""
    m = nm.get_map(mapping)
    y = m(np.zeros((1, 2)), axis=-1)
    return float(m.jvp(y, np.array([[1.0, 0.0]]), axis=-1)[0, 0])


def main():
    reg = Regularizer.from_string(EXPR, name="shannon_gini")
    dv = derive_map(reg)
    print(dv.pretty())
    Path("shannon_gini.tex").write_text(dv.latex())
    print("wrote shannon_gini.tex")

    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "derive.cli", "generate", "--expr", EXPR, "--name", "shannon_gini", "--out", folder]
        print("$ regattn " + " ".join(cmd[3:]))
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        sys.path.insert(0, folder)
        module = importlib.import_module("shannon_gini")
        print(f"imported {module.NAME}: link {module.LINK_METHOD}, threshold {module.THRESHOLD}, "
              f"{len(module.CUDA_SOURCE)} characters of CUDA")
        mine = nm.get_map(module)
        maps = {"softmax": "softmax", "shannon_gini": mine, "entmax15": "entmax15", "sparsemax": "sparsemax"}

        # 4. the derivation's predictions, checked on two scores s = [t, 0]
        half = dv.weight.subs(p, sympy.Rational(1, 2))
        print(f"\nwhat the Gini term changes (two scores s = [t, 0]):\n"
              f"  derived: w = 1/omega''(p) = {dv.weight}, w(1/2) = {half} (softmax: 1/2), so dp_1/dt at t = 0 "
              f"is {half / 2} (softmax: 1/4); omega'(0+) = {sympy.limit(dv.omega_prime, p, 0, '+')}, sparse: {dv.sparse}")
        print("  slope dp_1/dt at t = 0 (from each map's JVP): "
              + ", ".join(f"{name} {slope_at_zero(m):.4f}" for name, m in maps.items()))
        t = np.linspace(-3, 3, 601)
        curves = {name: two_scores(m, t) for name, m in maps.items()}
        for name, p1 in curves.items():
            zero = t[p1 == 0]
            where = f"p_1 = 0 exactly for t <= {zero.max():.2f}" if zero.size else "p_1 > 0 for every t"
            print(f"  {name:>13s}: {where}; smallest p_1 on t in [-3, 3]: {p1.min():.2e}")

        # 5. the new map in causal multi-head attention, next to softmax and sparsemax
        rng = np.random.default_rng(0)
        x = 4 * rng.standard_normal((1, 12, 16))
        allowed = np.tril(np.ones((12, 12), dtype=bool))
        weights = {}
        print("\ncausal multi-head attention, head 0:")
        for name in ("softmax", "shannon_gini", "sparsemax"):
            layer = nm.MultiHeadAttention(16, 2, mapping=maps[name], causal=True, dtype="float64", seed=1)
            y = layer.forward(x, need_weights=True)
            dx = layer.backward(np.ones_like(y))
            w = weights[name] = layer.attention_weights[0, 0]
            print(f"{name:>13s}: output norm {np.linalg.norm(y):.4f}, input-gradient norm {np.linalg.norm(dx):.4f}, "
                  f"exactly 0: {100 * np.mean(w[allowed] == 0):.1f}% of the allowed weights, "
                  f"smallest nonzero weight {w[w > 0].min():.2e}, largest weight per query on average {w.max(-1).mean():.3f}")
        for peer in ("softmax", "sparsemax"):
            diff = np.abs(weights["shannon_gini"] - weights[peer]).max()
            print(f"largest difference between shannon_gini's and {peer}'s weights: {diff:.3f}")
        sys.path.remove(folder)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig, axes = plt.subplots(2, 2, figsize=(10, 8.5), layout="constrained")
    ax = axes[0, 0]
    for name, p1 in curves.items():
        ax.plot(t, p1, label=name, lw=2.5 if name == "shannon_gini" else 1.5)
    ax.set_title("two scores s = [t, 0]: shannon_gini is the flattest,\nand like softmax never exactly 0 or 1",
                 fontsize=10)
    ax.set_xlabel("t")
    ax.set_ylabel("p_1")
    ax.legend()
    ax.grid(alpha=0.3)
    # log colours from 1e-10: exact zeros (grey) stand apart from small weights; white: not allowed (causal)
    cmap = plt.get_cmap("magma").with_extremes(under="lightgrey", bad="white")
    norm = LogNorm(vmin=1e-10, vmax=1)
    for ax, (name, w) in zip(axes.flat[1:], weights.items()):
        shown = np.where(allowed, np.where(w == 0, 1e-300, w), np.nan)
        im = ax.imshow(shown, norm=norm, cmap=cmap)
        ax.set_title(f"{name}: causal attention, head 0\n{100 * np.mean(w[allowed] == 0):.0f}% of the allowed weights "
                     "exactly 0", fontsize=10)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(im, ax=axes, extend="min", shrink=0.6,
                 label="weight (log scale; grey: exactly 0; white: a later key)")
    fig.savefig("derive_a_new_map.png", dpi=110, bbox_inches="tight")
    print("wrote derive_a_new_map.png")


if __name__ == "__main__":
    main()
