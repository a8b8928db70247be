"""The maps' front end (numeric.front): what a call and a loss cost around the solve, on small and medium inputs.

Run it beside an older tree to compare (one core, the medians of many calls, microseconds):

    PYTHONPATH=/path/to/old taskset -c 1 python benchmarks/bench_front.py
    taskset -c 1 python benchmarks/bench_front.py

Needs torch and JAX (the ``[torch,jax]`` extras).
"""

import json

import numpy as np
from _timing import median_seconds


def median_us(f, calls):
    return median_seconds(f, calls) * 1e6


def main():
    import jax.numpy as jnp
    import torch

    import numeric as nm
    from numeric import jax as rj
    from numeric import torch as rt

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64))
    labels = rng.integers(0, 64, 512)
    small = rng.standard_normal((8, 16))
    per_row = nm.get_map("entmax", alpha=np.linspace(1.2, 1.8, 512)[:, None])
    xt = torch.from_numpy(x).float().requires_grad_()
    lt = torch.from_numpy(labels)
    st, at = torch.from_numpy(small).float(), torch.full((8, 1), 1.5)
    xj, lj, sj = jnp.asarray(x, jnp.float32), jnp.asarray(labels), jnp.asarray(small, jnp.float32)
    out = {
        "numpy loss_and_grad softmax (512, 64)": median_us(lambda: nm.get_map("softmax").loss_and_grad(x, labels), 2000),
        "numpy loss_and_grad entmax15 (512, 64)": median_us(lambda: nm.get_map("entmax15").loss_and_grad(x, labels), 500),
        "numpy loss_and_grad entmax, alpha per row (512, 64)": median_us(lambda: per_row.loss_and_grad(x, labels), 30),
        "numpy entmax15 call (8, 16)": median_us(lambda: nm.entmax15(small), 2000),
        "torch entmax call, alpha tensor (8, 16)": median_us(lambda: rt.entmax(st, at), 2000),
        "torch loss forward+backward entmax15 (512, 64)": median_us(
            lambda: rt.fenchel_young_loss(xt, lt, "entmax15").backward(), 300),
        "jax eager entmax15 call (8, 16)": median_us(lambda: rj.entmax15(sj).block_until_ready(), 2000),
        "jax eager loss entmax15 (512, 64)": median_us(
            lambda: rj.fenchel_young_loss(xj, lj, "entmax15").block_until_ready(), 1000),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
