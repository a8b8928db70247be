"""Train a causal transformer block with learnable-alpha entmax attention in JAX, the batch sharded over devices.

Run: python examples/distributed_jax.py [--steps 150] [--devices 2]
     python examples/distributed_jax.py --check-gradients   (one step: sharded gradients vs one device's, float64)

Task (as examples/distributed_torch.py): sequences of random tokens; at every
position t >= LAG the model predicts the token LAG places back, which only
attention can fetch.  Model: token and position embeddings, one pre-norm
transformer block whose attention is ``numeric.jax.attention`` with
``mapping=get_map("entmax", alpha=...)``, one alpha per head kept inside (1, 2)
as ``alpha = 1 + sigmoid(logit)`` and learned, an MLP, a linear read-out, and
the softmax Fenchel-Young loss (cross-entropy) from
``numeric.jax.fenchel_young_loss``.  Pure JAX: the parameters are a dict of
arrays and Adam is written below in ``jax.numpy``.

Distribution is JAX's own: a :class:`jax.sharding.Mesh` over the devices with
one axis ``"batch"``; each batch is placed with ``NamedSharding(mesh,
P("batch"))`` (every device holds its slice of the examples), the parameters
and the optimizer's state with ``NamedSharding(mesh, P())`` (replicated), and
one ``jax.jit`` step is compiled for that placement: XLA's partitioner runs the
forward and backward passes on each slice and inserts the all-reduce of the
gradients (the loss is a mean over the whole batch).  Nothing of regattn knows
it is distributed: the maps' derived JVPs and their ``while_loop`` solvers are
ordinary JAX operations that the partitioner shards like any other.

On a CPU the script asks XLA for 2 host devices
(``--xla_force_host_platform_device_count=2``, added to ``XLA_FLAGS`` before
JAX is imported unless they already name a device count).  On many GPUs or hosts the same
code runs as it is: call ``jax.distributed.initialize()`` first in every
process (one per host, under SLURM or with a coordinator address), build the
mesh over ``jax.devices()`` (all the devices of all the processes), and give
each process's slice of the batch to
``jax.make_array_from_process_local_data(batch_sharding, local_batch)``
instead of ``jax.device_put``; the jitted step is unchanged.

After dispatching step i the loop waits for the loss of step i - ``AHEAD``, so
dispatch stays close behind the devices: XLA's CPU client admits at most 32
pending computations per device and blocks a dispatch beyond that on one of its
threads (one per core), and on a small machine that can be the thread the other
device needs for its half of a running step, whose all-reduce then never ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:  # (before JAX is imported: read once)
    os.environ["XLA_FLAGS"] = f"{_FLAGS} --xla_force_host_platform_device_count=2".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from numeric import jax as rj  # noqa: E402

VOCAB, LENGTH, LAG, EMBED, HEADS, BATCH = 16, 24, 3, 32, 4, 64
HEAD = EMBED // HEADS
AHEAD = 2  # steps dispatched before waiting for one (see the docstring)


def make_batch(step: int, batch: int = BATCH):
    """The batch of one training step: tokens and targets (the token LAG places back, at positions LAG...)."""
    tokens = np.random.default_rng(1000 + step).integers(0, VOCAB, size=(batch, LENGTH))
    return tokens.astype(np.int32), tokens[:, : LENGTH - LAG].astype(np.int32)


def init_params(dtype=jnp.float32) -> dict:
    """The model's parameters (the same on every run)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))

    def dense(n_in, n_out):
        return jax.random.normal(next(keys), (n_in, n_out), dtype) / np.sqrt(n_in)

    return {
        "tokens": jax.random.normal(next(keys), (VOCAB, EMBED), dtype),
        "positions": 0.1 * jax.random.normal(next(keys), (LENGTH, EMBED), dtype),
        "norm1": {"scale": jnp.ones(EMBED, dtype), "shift": jnp.zeros(EMBED, dtype)},
        "norm2": {"scale": jnp.ones(EMBED, dtype), "shift": jnp.zeros(EMBED, dtype)},
        "q": dense(EMBED, EMBED), "k": dense(EMBED, EMBED), "v": dense(EMBED, EMBED), "o": dense(EMBED, EMBED),
        "alpha_logit": jnp.zeros(HEADS, dtype),  # alpha = 1.5 at the start
        "mlp_in": dense(EMBED, 2 * EMBED), "mlp_in_bias": jnp.zeros(2 * EMBED, dtype),
        "mlp_out": dense(2 * EMBED, EMBED), "mlp_out_bias": jnp.zeros(EMBED, dtype),
        "read_out": dense(EMBED, VOCAB), "read_out_bias": jnp.zeros(VOCAB, dtype),
    }


def alphas(params):
    """One alpha per head, inside (1, 2)."""
    return 1 + jax.nn.sigmoid(params["alpha_logit"])


def layer_norm(x, p, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["shift"]


def forward(params, tokens):
    """Logits (B, LENGTH, VOCAB) of the token sequences (B, LENGTH)."""
    B = tokens.shape[0]
    x = params["tokens"][tokens] + params["positions"]
    h = layer_norm(x, params["norm1"])
    q, k, v = ((h @ params[n]).reshape(B, LENGTH, HEADS, HEAD) for n in "qkv")
    mapping = rj.get_map("entmax", alpha=alphas(params).reshape(HEADS, 1, 1))
    a = rj.attention(q, k, v, is_causal=True, mapping=mapping)
    x = x + a.reshape(B, LENGTH, EMBED) @ params["o"]
    h = layer_norm(x, params["norm2"])
    h = jax.nn.gelu(h @ params["mlp_in"] + params["mlp_in_bias"])
    x = x + h @ params["mlp_out"] + params["mlp_out_bias"]
    return x @ params["read_out"] + params["read_out_bias"]


def loss_of(params, tokens, targets):
    logits = forward(params, tokens)[:, LAG:]
    return rj.fenchel_young_loss(logits, targets, mapping="softmax")


def adam_init(params):
    """Adam's state: m and v are distinct arrays (the jitted step donates both; one buffer given twice is an error)."""
    return {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
            "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
    params = jax.tree.map(lambda p, m, v: p - (lr * (m / c1) / (jnp.sqrt(v / c2) + eps)).astype(p.dtype), params, m, v)
    return params, {"m": m, "v": v, "t": t}


def train_step(params, state, tokens, targets):
    loss, grads = jax.value_and_grad(loss_of)(params, tokens, targets)
    params, state = adam_update(params, grads, state)
    return params, state, loss


def make_mesh(devices: int) -> Mesh:
    found = jax.devices()
    if len(found) < devices:
        raise SystemExit(f"{devices} devices asked for, JAX sees {len(found)}: set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} before JAX starts")
    return Mesh(np.array(found[:devices]), ("batch",))


def train(steps: int, devices: int):
    """Train with the batch sharded over ``devices``; the loss of every step and the final parameters."""
    mesh = make_mesh(devices)
    batch, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    params = jax.device_put(init_params(), replicated)
    state = jax.device_put(adam_init(params), replicated)
    step = jax.jit(train_step, in_shardings=(replicated, replicated, batch, batch),
                   out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))
    history = []
    for i in range(steps):
        tokens, targets = (jax.device_put(a, batch) for a in make_batch(i))
        params, state, loss = step(params, state, tokens, targets)
        history.append(loss)
        if i >= AHEAD:
            history[i - AHEAD].block_until_ready()
    return [float(v) for v in history], params


def gradients(devices: int | None):
    """One step's gradients in float64: sharded over ``devices``, or (None) on one device without sharding."""
    params = init_params(jnp.float64)
    tokens, targets = make_batch(0)
    grad = jax.grad(loss_of)
    if devices is None:
        one = jax.devices()[0]
        put = lambda a: jax.device_put(a, one)  # noqa: E731
        return jax.jit(grad)(put(params), put(tokens), put(targets))
    mesh = make_mesh(devices)
    batch, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    fn = jax.jit(grad, in_shardings=(replicated, batch, batch), out_shardings=replicated)
    return fn(jax.device_put(params, replicated), jax.device_put(tokens, batch), jax.device_put(targets, batch))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--check-gradients", action="store_true")
    args = parser.parse_args(argv)
    if args.check_gradients:
        jax.config.update("jax_enable_x64", True)
        sharded, one = gradients(args.devices), gradients(None)
        # (compared on the host: the two live on different devices)
        pairs = [(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(one))]
        assert all(a.dtype == np.float64 for a, _ in pairs)
        worst = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)) for a, b in pairs)
        print(f"one step, {args.devices} devices vs one: {len(pairs)} parameters, largest relative difference {worst:.2e}")
        return 0
    start = time.perf_counter()
    history, params = train(args.steps, args.devices)
    for step in range(0, len(history), max(1, len(history) // 6)):
        print(f"step {step:4d}  loss {history[step]:.4f}")
    print(f"step {len(history) - 1:4d}  loss {history[-1]:.4f}")
    print("alpha per head:", " ".join(f"{a:.3f}" for a in np.asarray(alphas(params)).tolist()))
    n = min(10, len(history))
    first, last = sum(history[:n]) / n, sum(history[-n:]) / n
    print(f"loss fell from {first:.3f} to {last:.3f} (mean of the first and last {n} steps) over {args.devices} devices "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
