"""From a regularizer written as text to causal multi-head attention, in one script.

Run: python examples/derive_a_new_map.py   (writes derive_a_new_map.png and shannon_gini.tex)

1. omega(p) = p log p + p^2/2 (Shannon plus Gini) is parsed (never eval'd) and its
   map derived: the link is a LambertW, so the numeric side inverts omega' by Newton.
2. The derivation is printed, and written as LaTeX.
3. `regattn generate --expr ... --name shannon_gini --out DIR` writes the kernels; the
   module imports with plain Python and numeric.get_map accepts it.
4. The new map runs in causal multi-head attention next to softmax; their weights are drawn.
"""

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import numeric as nm
from derive import Regularizer, derive_map

EXPR = "p*log(p) + p**2/2"


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
        mapping = nm.get_map(module)

        rng = np.random.default_rng(0)
        x = 4 * rng.standard_normal((1, 12, 16))
        weights = {}
        for name, m in (("softmax", "softmax"), ("shannon_gini", mapping)):
            layer = nm.MultiHeadAttention(16, 2, mapping=m, causal=True, dtype="float64", seed=1)
            y = layer.forward(x, need_weights=True)
            dx = layer.backward(np.ones_like(y))
            weights[name] = layer.attention_weights[0, 0]
            print(f"{name:>13s}: output norm {np.linalg.norm(y):.4f}, input-gradient norm {np.linalg.norm(dx):.4f}, "
                  f"smallest nonzero weight {weights[name][weights[name] > 0].min():.2e}")
        diff = np.abs(weights["softmax"] - weights["shannon_gini"]).max()
        print(f"largest difference between the two maps' weights: {diff:.3f}")
        sys.path.remove(folder)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, (name, w) in zip(axes, weights.items()):
        im = ax.imshow(w, vmin=0, vmax=1, cmap="magma")
        ax.set_title(f"{name}, head 0 (causal)")
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig("derive_a_new_map.png", dpi=110, bbox_inches="tight")
    print("wrote derive_a_new_map.png")


if __name__ == "__main__":
    main()
