"""Fertility-constrained attention: each source word's total attention over the decoding is capped by its fertility.

A decoder that attends with plain softmax or sparsemax may look at the same source word again and again
(over-translation) and never at another (dropping).  Constrained attention (Martins and Kreutzer 2017; Malaviya
et al. 2018) bounds step t's weights by what each word has left, ``upper_t = max(0, fertility - attention so far)``,
so that no word is attended to more than its fertility in all.  regattn gives this for every map: ``upper=`` on
the map, on attention and on the torch layer.

1. Decoding with fixed fertilities (NumPy): the coverage of each source word with and without the bounds.
2. Learning the fertilities (torch): the decoded attention of unknown fertilities is the target; the learner's
   fertilities follow the gradient through the bounds (``upper`` gets a gradient) back to the truth.

Run: python examples/constrained_attention.py   (part 2 needs torch)
"""

from __future__ import annotations

import numpy as np

import numeric as nm

rng = np.random.default_rng(3)
S = 6  # source words
fertility = np.array([1.0, 1.0, 2.0, 0.5, 1.0, 0.5])  # sums to T: one unit of attention per decoding step
T = int(fertility.sum())
# scores of each decoding step over the source words: word 2 stands out at every step (a decoder stuck on it)
scores = rng.standard_normal((T, S)) + np.array([0.0, 0.0, 2.5, 0.0, 0.0, 0.0])


def decode(mapping, bounded: bool) -> np.ndarray:
    """The (T, S) attention of the decoding steps, each bounded by the fertility left, or not."""
    m = nm.get_map(mapping)
    used = np.zeros(S)
    rows = []
    for t in range(T):
        p = m(scores[t], upper=np.maximum(fertility - used, 0.0)) if bounded else m(scores[t])
        used += p
        rows.append(p)
    return np.array(rows)


print("fertility         ", np.array2string(fertility, precision=2))
for mapping in ("softmax", "sparsemax", "entmax15"):
    plain, bounded = decode(mapping, False), decode(mapping, True)
    print(f"{mapping:9s} plain    coverage {np.array2string(plain.sum(0), precision=2)}  "
          f"over fertility by up to {max(0.0, (plain.sum(0) - fertility).max()):.2f}")
    print(f"{mapping:9s} bounded  coverage {np.array2string(bounded.sum(0), precision=2)}  "
          f"over fertility by up to {max(0.0, (bounded.sum(0) - fertility).max()):.1e}")
    assert (plain.sum(0) - fertility).max() > 0.5  # the plain decoder over-translates word 2
    assert np.all(bounded.sum(0) <= fertility + 1e-12)  # the bounds hold: every word's coverage within its fertility
    np.testing.assert_allclose(bounded.sum(1), 1.0, atol=1e-12)  # each step still a distribution
    assert np.allclose(bounded.sum(0), fertility, atol=1e-9)  # all fertility used: T steps, sum = T
print("sparse maps leave zeros:", int((decode("sparsemax", True) == 0).sum()), "of", T * S,
      "bounded sparsemax weights are exactly 0")

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    raise SystemExit("part 2 needs torch (pip install 'regattn[torch]')") from None

from numeric import torch as rt  # noqa: E402


def decode_torch(x, fert, mapping):
    """:func:`decode` in torch, differentiable in the fertilities (through every step's bound)."""
    used = torch.zeros_like(fert)
    rows = []
    for t in range(T):
        p = mapping(x[t], upper=torch.clamp(fert - used, min=0.0))
        used = used + p
        rows.append(p)
    return torch.stack(rows)


x = torch.from_numpy(scores)
sparsemax = rt.get_map("sparsemax")
target = decode_torch(x, torch.from_numpy(fertility), sparsemax).detach()
theta = torch.zeros(S, dtype=torch.float64, requires_grad=True)  # fertilities T * softmax(theta): all equal at first
optimizer = torch.optim.Adam([theta], lr=0.05)
for step in range(401):
    optimizer.zero_grad()
    learned = T * torch.softmax(theta, 0)
    loss = ((decode_torch(x, learned, sparsemax) - target) ** 2).sum()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step:3d}  loss {loss.item():.3e}  fertility {np.array2string(learned.detach().numpy(), precision=3)}")
learned = (T * torch.softmax(theta, 0)).detach().numpy()
print("learned fertility", np.array2string(learned, precision=3), " true", np.array2string(fertility, precision=2))
assert np.abs(learned - fertility).max() < 0.05
