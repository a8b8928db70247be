"""Heads that attend to nothing: a small causal model trained with a learned sink per head, softmax against entmax15,
and sigmoid attention (no sum, so nothing to sink).

Run: python examples/attention_sinks.py [--steps 800]   (writes attention_sinks.png)

Task: a sequence of symbols (one of four), each inactive, except that in half the sequences one of them, at a
random place, is active.  At each position the model outputs the active symbol seen so far, or NONE.  A token's
key is its symbol's embedding plus, if active, an "active" vector, but its value is its symbol's alone: an inactive
token's value looks like an answer, so where no active token has been seen whatever a head attends to brings a wrong
one, unless the heads' mix can be told apart from an answer; a head with a sink can attend to nothing instead.

Model: token embeddings, one causal attention layer (numeric.torch.MultiheadAttention, 4 heads), a linear read-out
of the attention's output alone; Adam (learning rate 0.01), cross-entropy.  With ``learn=("sink",)`` the layer learns one sink
score per head (gpt-oss's sinks; numeric.constraints.sink): each row's weights are the map over the scores and the
sink, the sink's weight dropped, so a row's weights sum to at most 1.  Softmax then gives the sink most of the weight
but never all of it; entmax15 gives it all of it, exactly: the row's weights are all 0 and the head's output is 0.
Sigmoid attention has no sum to give away: it attends to nothing as its scores go to -inf, and never exactly.

Printed: each map's held-out loss and accuracy, and for each head, on the positions where no active symbol has been
seen, on how many it attends to nothing (every weight exactly 0) and the largest weight it leaves on a token.  The
heads share the task, each as the training happens to shape it: which head attends to nothing, and on how many
positions, changes with the seeds; that softmax's heads never do and entmax15's some do does not.  (This set-up, four
heads at a learning rate of 0.01 for 800 steps, learns the task for every map on each of the model and batch seeds
0-5; two heads at 0.03 for 400 steps did not, for any of the three maps.)
"""

import argparse
import sys
import time

import numpy as np
import torch

from numeric.torch import MultiheadAttention

SYMBOLS, LENGTH, EMBED, HEADS, BATCH = 4, 12, 16, 4, 64
NONE = 0  # the class of "no active symbol seen"; symbol v (0..SYMBOLS - 1) is class v + 1


def batch(rng, size=BATCH):
    """``(tokens, targets, seen)``: symbols (ids 0..SYMBOLS - 1 inactive, SYMBOLS + v the active symbol v), one active
    in half the sequences; the target at each position (NONE before the active one), and whether it has been seen."""
    tokens = rng.integers(0, SYMBOLS, size=(size, LENGTH))
    has = rng.random(size) < 0.5
    where = rng.integers(0, LENGTH, size=size)
    symbol = tokens[np.arange(size), where]
    tokens[has, where[has]] += SYMBOLS
    seen = has[:, None] & (np.arange(LENGTH)[None, :] >= where[:, None])
    targets = np.where(seen, symbol[:, None] + 1, NONE)
    return torch.tensor(tokens), torch.tensor(targets), torch.tensor(seen)


class Model(torch.nn.Module):
    def __init__(self, mapping, sink: bool, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.symbol = torch.nn.Embedding(SYMBOLS, EMBED)
        self.active = torch.nn.Parameter(torch.randn(EMBED))
        self.attn = MultiheadAttention(EMBED, HEADS, batch_first=True, mapping=mapping,
                                       learn=("sink",) if sink else ())
        self.out = torch.nn.Linear(EMBED, SYMBOLS + 1)

    def forward(self, tokens):
        values = self.symbol(tokens % SYMBOLS)
        x = values + (tokens >= SYMBOLS)[..., None] * self.active
        causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(1)  # (True: not allowed, as torch's layer)
        y, w = self.attn(x, x, values, attn_mask=causal, need_weights=True, average_attn_weights=False)
        return self.out(y), w  # w: (batch, heads, L, L)


MAPS = {"softmax + sink": ("softmax", True), "entmax15 + sink": ("entmax15", True), "sigmoid": ("sigmoid", False)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    args = parser.parse_args()
    torch.set_num_threads(1)
    probe = batch(np.random.default_rng(123), size=512)
    curves, rows, pictures = {}, {}, {}
    for label, (mapping, sink) in MAPS.items():
        rng = np.random.default_rng(0)
        model = Model(mapping, sink, seed=1)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        losses = []
        start = time.perf_counter()
        for i in range(args.steps):
            tokens, targets, _ = batch(rng)
            logits, _ = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SYMBOLS + 1), targets.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            sys.stderr.write(f"\r{label:>16s} {i + 1}/{args.steps} loss {losses[-1]:.3f}")
        sys.stderr.write("\n")
        with torch.no_grad():
            tokens, targets, seen = probe
            logits, w = model(tokens)
            loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, SYMBOLS + 1), targets.reshape(-1)))
            accuracy = float((logits.argmax(-1) == targets).float().mean())
            blind = ~seen  # (batch, L): no active symbol seen at that position
            heads = []
            for h in range(HEADS):  # per head, on those positions: the rows whose weights are all exactly 0
                wh = w[:, h][blind]
                heads.append((float((wh == 0).all(-1).float().mean()), float(wh.max())))
            rows[label] = (loss, accuracy, heads, time.perf_counter() - start)
            i = next(i for i in range(len(tokens)) if seen[i].any() and int(seen[i].int().argmax()) >= LENGTH // 3)
            pictures[label] = (w[i].numpy(), tokens[i].numpy(), seen[i].numpy())  # (an active symbol midway)
        curves[label] = losses
    print(f"active-symbol retrieval, {SYMBOLS} symbols, length {LENGTH}, {HEADS} heads, "
          f"{args.steps} Adam steps of {BATCH} sequences; on 512 held-out sequences:")
    for label, (loss, accuracy, heads, seconds) in rows.items():
        print(f"  {label}: loss {loss:.2e}, accuracy {accuracy:.1%} ({seconds:.1f} s); where no active symbol has been "
              f"seen:")
        for h, (nothing, top) in enumerate(heads):
            print(f"    head {h}: attends to nothing on {nothing:.1%} of the positions, largest weight on a token "
                  f"{top:.3g}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(MAPS), figsize=(4.2 * (1 + len(MAPS)), 3.8))
    for label, losses in curves.items():
        axes[0].plot(losses, label=label)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss")
    axes[0].legend()
    for ax, (label, (w, tokens, seen)) in zip(axes[1:], pictures.items()):
        total = w.sum(-1)  # (heads, L): the weight a head puts on the tokens at each position
        ax.imshow(total, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        empty = np.argwhere((w == 0).all(-1))
        ax.scatter(empty[:, 1], empty[:, 0], marker="o", facecolors="none", edgecolors="w", s=80,
                   label="attends to nothing")
        ax.set_xticks(range(LENGTH), [f"{t % SYMBOLS}" + ("*" if t >= SYMBOLS else "") for t in tokens])
        ax.set_yticks(range(HEADS), [f"head {h}" for h in range(HEADS)])
        ax.set_title(f"{label}: weight on the tokens")
        ax.set_xlabel("token (its symbol; *: active)")
        first = int(np.argmax(seen)) if seen.any() else LENGTH
        ax.axvline(first - 0.5, color="r", lw=1)
    axes[1].legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig("attention_sinks.png", dpi=110)
    print("wrote attention_sinks.png")


if __name__ == "__main__":
    main()
