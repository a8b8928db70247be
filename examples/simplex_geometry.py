"""The geometry of regularized argmax (seed "attention via geometric intuition"): where p*(s) lands.

Run: python examples/simplex_geometry.py   (writes simplex_geometry.png)

Without a regularizer, argmax <p, s> over the simplex is a vertex (a linear
program).  Shannon negentropy (softmax) keeps p*(s) in the interior; the Gini
entropy (sparsemax) reaches the faces and vertices; Tsallis alpha = 1.5 lies in
between.  Left: for 2 scores, p_1 against s_1 - s_2.  Right: for 3 scores drawn
at random, the points p*(s) on the 2-simplex, and how many land on its boundary.
"""

import numpy as np

import numeric as nm

MAPS = {"softmax (Shannon)": nm.softmax, "1.5-entmax (Tsallis)": nm.entmax15, "sparsemax (Gini)": nm.sparsemax}


def barycentric(p):
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    return p @ corners


def main():
    gap = np.linspace(-3, 3, 601)
    two = np.stack([gap, np.zeros_like(gap)], axis=-1)
    print("two scores, p_1 at s_1 - s_2 = -1, -0.5, 0, 0.5, 1:")
    picks = [200, 250, 300, 350, 400]
    print(f"  {'argmax':>22s}: " + ", ".join(f"{float(gap[i] > 0) if gap[i] != 0 else 0.5:.3f}" for i in picks))
    curves = {}
    for name, fn in MAPS.items():
        curves[name] = fn(two)[:, 0]
        print(f"  {name:>22s}: " + ", ".join(f"{curves[name][i]:.3f}" for i in picks))

    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3000, 3)) * 1.5
    print("\nthree scores ~ N(0, 1.5^2), 3000 draws: where p*(s) lands on the 2-simplex")
    clouds = {}
    for name, fn in MAPS.items():
        p = fn(scores)
        clouds[name] = p
        zeros = (p == 0).sum(axis=1)
        print(f"  {name:>22s}: interior {np.mean(zeros == 0):6.1%}, on an edge {np.mean(zeros == 1):6.1%}, "
              f"at a vertex {np.mean(zeros == 2):6.1%}")
    print(f"  {'argmax':>22s}: at a vertex 100.0%")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(MAPS), figsize=(15, 3.8))
    axes[0].step(gap, (gap > 0).astype(float), where="mid", color="k", label="argmax (no regularizer)")
    for name, curve in curves.items():
        axes[0].plot(gap, curve, label=name)
    axes[0].set_xlabel("s_1 - s_2")
    axes[0].set_ylabel("p_1")
    axes[0].legend(fontsize=7)
    axes[0].set_title("two scores")
    triangle = barycentric(np.vstack([np.eye(3), np.eye(3)[:1]]))
    for ax, (name, p) in zip(axes[1:], clouds.items()):
        xy = barycentric(p)
        ax.plot(triangle[:, 0], triangle[:, 1], "k-", lw=1)
        ax.scatter(xy[:, 0], xy[:, 1], s=2, alpha=0.4)
        ax.set_title(name)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig("simplex_geometry.png", dpi=110)
    print("wrote simplex_geometry.png")


if __name__ == "__main__":
    main()
