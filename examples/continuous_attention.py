"""Continuous attention: densities derived in closed form, then a layer on a toy signal.

Run: python examples/continuous_attention.py [--steps 600]   (writes continuous_attention.png)

1. derive.continuous derives the regularized argmax over densities for the
   scores f(t) = theta_1 t + theta_2 t^2: Shannon gives a Gaussian, Gini
   (continuous sparsemax) a truncated parabola with compact support, Tsallis 3/2
   a biweight.  For the same scores the three densities are printed and drawn.
2. numeric.ContinuousAttention on a toy signal: each sequence of 64 samples
   carries a noisy signal and a marker on a random window of 8 samples; the
   task is the mean of the signal over the marked window.  The layer turns a
   discrete softmax over positions into (mu, sigma^2), attends with the
   continuous density to the values (regressed on 32 Gaussian basis
   functions), and a linear read-out gives the estimate.  Trained by gradient
   Adam, with the Gaussian and with continuous sparsemax.
"""

import argparse

import numpy as np
import sympy as sp

import numeric as nm
from _optim import Adam
from derive import gini, shannon, tsallis
from derive.continuous import derive_continuous, sigma2, theta1, theta2

LENGTH, EMBED, BATCH, WINDOW = 64, 4, 32, 8
MAPS = {"softmax": shannon, "sparsemax": gini, "entmax15": lambda: tsallis(sp.Rational(3, 2))}


def derived_densities(th1=6.0, th2=-6.0):
    """The three continuous maps for f(t) = th1 t + th2 t^2, derived and evaluated."""
    ts = np.linspace(-0.25, 1.25, 601)
    out = {}
    print(f"scores f(t) = {th1:g} t {th2:+g} t^2")
    for name, factory in MAPS.items():
        cm = derive_continuous(factory())
        mu_v = float(cm.mean.subs({theta1: th1, theta2: th2}))
        var_v = float(cm.variance.subs({theta1: th1, theta2: th2}))
        density = nm.get_continuous_map(name).density(ts, mu_v, var_v)
        if cm.family == "compact":
            a = float(cm.support_radius.subs(sigma2, var_v))
            print(f"  {name:>9s}: {cm.family}, a = {sp.sstr(cm.support_radius)} = {a:.4f}, "
                  f"support [{mu_v - a:.4f}, {mu_v + a:.4f}], p(mu) = {density.max():.4f}")
        else:
            print(f"  {name:>9s}: {cm.family}, N(mu = {mu_v:.4f}, sigma^2 = {var_v:.4f}), p(mu) = {density.max():.4f}, "
                  "support: the real line")
        out[name] = density
    return ts, out


def batch(rng):
    t = nm.continuous.positions(LENGTH)
    freq = rng.uniform(1, 3, (BATCH, 1))
    phase = rng.uniform(0, 2 * np.pi, (BATCH, 1))
    signal = np.sin(2 * np.pi * freq * t + phase) + 0.1 * rng.standard_normal((BATCH, LENGTH))
    start = rng.integers(0, LENGTH - WINDOW, BATCH)
    marker = (np.arange(LENGTH) >= start[:, None]) & (np.arange(LENGTH) < start[:, None] + WINDOW)
    x = np.stack([signal, marker.astype(float), np.ones_like(signal), np.broadcast_to(t, signal.shape)], axis=-1)
    target = (signal * marker).sum(-1) / WINDOW
    return x, target


def train(name, steps, seed=0):
    rng = np.random.default_rng(seed)
    basis = nm.GaussianBasis.uniform(64, widths=(0.02, 0.05))
    layer = nm.ContinuousAttention(EMBED, mapping=name, basis=basis, seed=seed, min_variance=1e-4)
    # start from uniform attention over the positions (mu = 1/2, sigma^2 = 1/12): from a random
    # query the Gaussian can settle on a wide density that ignores the marker
    layer.params["query"][:] = 0
    readout = np.zeros(EMBED)
    params = {**{f"attn.{k}": v for k, v in layer.params.items()}, "readout": readout}
    opt = Adam(params, lr=0.05)
    losses = []
    for _ in range(steps):
        x, target = batch(rng)
        context = layer.forward(x)
        err = context @ readout - target
        losses.append(float((err**2).mean()))
        dctx = (2 * err / BATCH)[:, None] * readout
        grads = {"readout": context.T @ (2 * err / BATCH)}
        layer.backward(dctx)
        grads.update({f"attn.{k}": g for k, g in layer.grads.items()})
        opt.update(params, grads)
    x, target = batch(np.random.default_rng(1234))
    held_out = float(((layer.forward(x) @ readout - target) ** 2).mean())
    return layer, readout, losses, held_out, x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    ts, densities = derived_densities()

    print(f"\ntoy signal: mean of the signal over a marked window of {WINDOW} of {LENGTH} samples, "
          f"{args.steps} steps of {BATCH} sequences")
    baseline = float(np.var(batch(np.random.default_rng(1234))[1]))
    print(f"  predicting the mean target: mean squared error {baseline:.4f}")
    trained = {}
    for name in ("softmax", "sparsemax"):
        layer, readout, losses, held_out, x = train(name, args.steps)
        mu_v, var_v = layer.mu[0], layer.sigma2[0]
        t = nm.continuous.positions(LENGTH)
        inside = np.abs(t - mu_v) < nm.get_continuous_map(name).module.support_radius(var_v)
        marked = np.flatnonzero(x[0, :, 1])
        print(f"  {name:>9s}: held-out mean squared error {held_out:.4f} (first steps {np.mean(losses[:10]):.4f}); "
              f"sequence 0: window t in [{t[marked[0]]:.3f}, {t[marked[-1]]:.3f}], mu = {mu_v:.3f}, sigma^2 = {var_v:.4f}, "
              f"positions in the support: {int(inside.sum())} of {LENGTH}")
        trained[name] = (layer, losses, x)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, dens in densities.items():
        axes[0].plot(ts, dens, label=name)
    axes[0].set(title="derived densities, f(t) = 6t - 6t^2", xlabel="t", ylabel="p(t)")
    axes[0].legend()
    for name, (layer, losses, x) in trained.items():
        axes[1].semilogy(losses, label=name)
        t = nm.continuous.positions(LENGTH)
        axes[2].plot(t, nm.get_continuous_map(name).density(t, layer.mu[0], layer.sigma2[0]), label=f"{name} density")
    axes[1].set(title="training loss (mean squared error)", xlabel="step")
    axes[1].legend()
    x = trained["sparsemax"][2]
    axes[2].plot(t, x[0, :, 0], color="gray", lw=0.8, label="signal")
    axes[2].fill_between(t, 0, x[0, :, 1] * 2, color="orange", alpha=0.2, label="marked window")
    axes[2].set(title="held-out sequence 0", xlabel="t")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig("continuous_attention.png", dpi=100)
    print("wrote continuous_attention.png")


if __name__ == "__main__":
    main()
