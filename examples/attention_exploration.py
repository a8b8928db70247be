"""Attention exploration with derived maps: copying, averaging, and key variance across heads.

Run: python examples/attention_exploration.py   (writes attention_exploration.png)

Keys have orthonormal means m_1..m_n, values v_1..v_n are random.
(a) Copying: q = beta m_j. As beta grows the weights concentrate on key j and
    c -> v_j; softmax only in the limit, sparsemax and 1.5-entmax exactly at a
    finite beta.
(b) Averaging: q = beta (m_a + m_b) gives weights ~1/2, 1/2 and c ~ (v_a + v_b)/2.
(c) Key variance: when k_a's length along m_a varies (k_a ~ N(m_a, a I + m_a m_a^T / 2)),
    one query cannot average: the weight on a swings between 0 and 1 from sample to sample.
(d) Two heads, q1 = beta m_a and q2 = beta m_b, averaged, recover (v_a + v_b)/2
    whatever the scale of k_a.
"""

import numpy as np

import numeric as nm

D, N, A_IDX, B_IDX = 8, 6, 0, 1
MAPS = ("softmax", "sparsemax", "entmax15")


def attend(mapping, q, keys, values):
    return nm.attention(q[None, :], keys, values, mapping=mapping, scale=1.0, return_weights=True)


def main():
    rng = np.random.default_rng(0)
    means = np.eye(D)[:N]  # orthonormal key means
    values = rng.standard_normal((N, D))
    target_avg = (values[A_IDX] + values[B_IDX]) / 2

    print("(a) copying v_j with q = beta m_j: |c - v_j|")
    print("   beta " + "".join(f"{m:>12s}" for m in MAPS))
    for beta in (1.0, 4.0, 16.0, 64.0):
        errs = [np.linalg.norm(attend(m, beta * means[2], means, values)[0][0] - values[2]) for m in MAPS]
        print(f"  {beta:5.0f} " + "".join(f"{e:12.2e}" for e in errs))

    print("\n(b) averaging with q = beta (m_a + m_b): weights on a, b and |c - (v_a + v_b)/2|")
    for beta in (4.0, 16.0):
        for m in MAPS:
            c, w = attend(m, beta * (means[A_IDX] + means[B_IDX]), means, values)
            print(f"  beta {beta:4.0f} {m:>9s}: alpha_a = {w[0, A_IDX]:.4f}, alpha_b = {w[0, B_IDX]:.4f}, "
                  f"|c - avg| = {np.linalg.norm(c[0] - target_avg):.2e}")

    print("\n(c) key variance: k_a ~ N(m_a, 0.01 I + m_a m_a^T / 2), q = 16 (m_a + m_b), 500 samples")
    beta, samples = 16.0, 500
    single = {m: [] for m in MAPS}
    two = {m: [] for m in MAPS}
    for _ in range(samples):
        keys = means + 0.1 * rng.standard_normal((N, D))
        keys[A_IDX] += np.sqrt(0.5) * rng.standard_normal() * means[A_IDX]
        for m in MAPS:
            c, w = attend(m, beta * (means[A_IDX] + means[B_IDX]), keys, values)
            single[m].append((w[0, A_IDX], np.linalg.norm(c[0] - target_avg)))
            c1, _ = attend(m, beta * means[A_IDX], keys, values)
            c2, _ = attend(m, beta * means[B_IDX], keys, values)
            two[m].append(np.linalg.norm((c1[0] + c2[0]) / 2 - target_avg))
    for m in MAPS:
        w = np.array([a for a, _ in single[m]])
        e1 = np.array([e for _, e in single[m]])
        print(f"  {m:>9s}: alpha_a from {w.min():.3f} to {w.max():.3f} (std {w.std():.3f}); "
              f"median |c - avg| one head {np.median(e1):.3f}, two heads {np.median(two[m]):.3f}")
    print("\n(d) two heads (q1 = beta m_a, q2 = beta m_b, outputs averaged) keep c near (v_a + v_b)/2.")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for m in MAPS:
        axes[0].hist([a for a, _ in single[m]], bins=30, range=(0, 1), alpha=0.5, label=m)
        axes[1].hist([np.log10(e + 1e-16) for _, e in single[m]], bins=30, alpha=0.4, label=f"{m}, one head")
        axes[1].hist(np.log10(np.array(two[m]) + 1e-16), bins=30, alpha=0.4, histtype="step", lw=2, label=f"{m}, two heads")
    axes[0].set_xlabel("weight on key a (one head)")
    axes[0].set_title("high variance in k_a: no stable average")
    axes[0].legend()
    axes[1].set_xlabel("log10 |c - (v_a + v_b)/2|")
    axes[1].set_title("two heads fix it")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig("attention_exploration.png", dpi=110)
    print("wrote attention_exploration.png")


if __name__ == "__main__":
    main()
