"""Adaptively sparse attention in a HuggingFace transformers model: alpha-entmax with alpha learned per head.

Run: python examples/hf_adaptive_sparsity.py [--steps 300] [--tune 150]   (writes hf_adaptive_sparsity.png;
needs torch and transformers: pip install 'regattn[hf]')

A small Llama (2 layers, 4 query heads sharing 2 key/value heads: grouped-query
attention), randomly initialised, is trained as a causal language model on a
toy task that needs attention: a sequence of 8 random tokens, a separator, and
the same 8 tokens again; the loss counts the copy, which the model can only
predict by looking back 9 positions.  It is trained with transformers' own
softmax attention (SDPA), then switched with ``numeric.torch.hf.sparsify`` to
alpha-entmax with one alpha per layer and head, learned (Correia et al. 2019,
"Adaptively Sparse Transformers"), starting at 1.5, and fine-tuned with the
alphas trained with the other weights.  Each alpha is kept inside (0, 3), the
range ``sparsify`` gives the entmax family from 1.5: a head may go dense
(alpha < 1), stay near softmax (alpha = 1) or turn sparse (alpha > 1).  Printed: the copy
accuracy before the switch, right after it and after fine-tuning; each head's
alpha and its fraction of attention weights that are exactly zero.  The picture:
the training loss, alpha per layer and head, and the zero fractions.
"""

import argparse
import sys
import time

import torch
import transformers

from numeric.torch import hf

VOCAB, HALF, BATCH = 16, 8, 64
SEP = VOCAB  # the separator token
LAYERS, HEADS = 2, 4
#: the alphas' logits learn faster than the weights (one number per head, from a model trained without them)
ALPHA_LR = 0.05


def batch(g):
    """``(ids, labels)``: 8 tokens, the separator, the 8 tokens again; labels only on the copy (-100 elsewhere)."""
    x = torch.randint(0, VOCAB, (BATCH, HALF), generator=g)
    ids = torch.cat([x, torch.full((BATCH, 1), SEP), x], dim=1)
    labels = torch.full_like(ids, -100)
    labels[:, HALF + 1:] = x
    return ids, labels


def accuracy(model, ids, labels) -> float:
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    guess = logits[:, :-1].argmax(-1)  # the token predicted for each next position
    target = labels[:, 1:]
    copy = target != -100
    return float((guess[copy] == target[copy]).float().mean())


def train(model, steps, g, lr, name, losses, alpha_lr=None):
    """Adam on the model's weights (the learned alphas' logits, where there are any, at ``alpha_lr``)."""
    alpha = [p for n, p in model.named_parameters() if n.endswith("regattn_alpha_logit")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("regattn_alpha_logit")]
    groups = [{"params": rest}] + ([{"params": alpha, "lr": alpha_lr}] if alpha else [])
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
    model.train()
    for i in range(steps):
        ids, labels = batch(g)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (i + 1) % 25 == 0 or i + 1 == steps:
            sys.stderr.write(f"\r{name:>8s} step {i + 1}/{steps} loss {loss.item():.3f}")
    sys.stderr.write("\n")
    model.eval()


def zero_fractions(model, ids):
    """``(layers, heads)``: the fraction of each head's weights that are exactly 0 among the keys it may attend to
    (the causal ones)."""
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions
    T = ids.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.stack([(w == 0)[..., allowed].float().mean(dim=(0, 2)) for w in weights])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="softmax training steps")
    parser.add_argument("--tune", type=int, default=150, help="fine-tuning steps after the switch")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB + 1, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                                      max_position_embeddings=2 * HALF + 1)
    model = transformers.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    probe = batch(torch.Generator().manual_seed(123))
    losses = []
    start = time.perf_counter()
    train(model, args.steps, g, 3e-3, "softmax", losses)
    trained = time.perf_counter() - start
    before = accuracy(model, *probe)

    hf.sparsify(model, "entmax", learn=("alpha",), alpha=1.5)
    switched = accuracy(model, *probe)
    start = time.perf_counter()
    train(model, args.tune, g, 1e-3, "entmax", losses, alpha_lr=ALPHA_LR)
    tuned = time.perf_counter() - start
    after = accuracy(model, *probe)
    alphas = torch.stack([v["alpha"].detach() for v in hf.learned(model).values()])
    zeros = zero_fractions(model, probe[0])

    print(f"copy task, {HALF} tokens of {VOCAB}; Llama, {LAYERS} layers x {HEADS} heads (2 key/value heads)")
    print(f"  softmax (SDPA), {args.steps} steps ({trained:.0f} s): copy accuracy {before:.1%}")
    print(f"  switched to alpha-entmax, alpha = 1.5 in every head: copy accuracy {switched:.1%}")
    print(f"  fine-tuned {args.tune} steps with alpha learned per head ({tuned:.0f} s): copy accuracy {after:.1%}")
    print(f"  attention implementation: {model.config._attn_implementation}")
    for layer in range(LAYERS):
        heads = ", ".join(f"{a:.3f} ({z:.0%} zeros)" for a, z in zip(alphas[layer].tolist(), zeros[layer].tolist()))
        print(f"  layer {layer}: alpha (exact zeros among the causal weights) per head: {heads}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(losses)
    axes[0].axvline(args.steps, color="k", ls="--", lw=0.8)
    axes[0].text(args.steps, max(losses), " switch to entmax", va="top", fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (copy)")
    for ax, values, title, fmt, (lo, hi) in ((axes[1], alphas, "alpha per layer and head", "{:.2f}", (0, 3)),
                                             (axes[2], zeros, "fraction of weights exactly 0", "{:.0%}", (0, 1))):
        im = ax.imshow(values.numpy(), vmin=lo, vmax=hi, cmap="viridis")
        for (i, j), v in zip([(i, j) for i in range(LAYERS) for j in range(HEADS)], values.flatten().tolist()):
            ax.text(j, i, fmt.format(v), ha="center", va="center", color="w" if v < (lo + hi) / 2 else "k")
        ax.set_xticks(range(HEADS))
        ax.set_yticks(range(LAYERS))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig("hf_adaptive_sparsity.png", dpi=110)
    print("wrote hf_adaptive_sparsity.png")


if __name__ == "__main__":
    main()
