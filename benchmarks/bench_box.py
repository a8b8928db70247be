"""Bounded maps (box constraints, ``upper=``/``total=``) side by side with the peers, in one run (CPU, float32).

Run (torch's CPU wheel first, then the peers):

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e '.[torch]' entmax
    python benchmarks/bench_box.py [--quick] [--out benchmarks/results]

* budget sparsemax (``0 <= p <= 1``, ``sum p = k``), forward and forward+backward, n = 64 / 1024 / 16384 with
  2**17 scores in all: ``numeric.torch.sparsemax(x, upper=1, total=k)`` against the entmax package's
  ``budget_bisect(x, k)`` (50 bisection halvings), and both against the float64 solution (the largest error);
* the price of the box on each map: ``m(x, upper=u)`` against ``m(x)`` (a bound of ``1.5 / n`` on every entry,
  so that many bind), torch forward+backward and NumPy forward, for softmax, sparsemax, entmax15, entmax at
  alpha 0.6 and the typed maps of :data:`_typed.TYPED` (no closed-form link);
* normmax (``alpha`` 1.5, 2, 4), forward and forward+backward: ``numeric.torch.normmax`` against the entmax
  package's ``normmax_bisect``, and both against the float64 solution;
* constrained softmax against the sort-based algorithm written per row in NumPy as the constrained-softmax
  papers state it (sort by ``exp(s_i) / u_i``, saturate a prefix), the only other implementation there is.

Every figure is a ratio of medians measured in this run.  Writes ``box.json`` and ``box.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from _timing import median_seconds
from _typed import typed_modules

SIZES = (64, 1024, 16384)
MIN_SECONDS = 0.25


def _sort_constrained_softmax(x, u):
    """Constrained softmax per row from its KKT conditions: entries sorted by ``exp(s_i) / u_i`` decreasing, the
    first ``r`` saturated at ``u_i`` and the rest ``exp(s_i) (1 - U_r) / Z_r`` (``U_r``, ``Z_r`` the sums of the
    saturated bounds and the rest's exponentials), with the smallest ``r`` whose rest stays below its bounds."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        e = np.exp(x[i] - x[i].max())
        order = np.argsort(-(e / u[i]))
        es, us = e[order], u[i][order]
        taken = np.concatenate(([0.0], np.cumsum(us)))
        rest = np.concatenate((np.cumsum(es[::-1])[::-1], [0.0]))
        for r in range(len(es) + 1):
            scale = (1 - taken[r]) / rest[r] if rest[r] > 0 else 0.0
            if r == len(es) or es[r] * scale <= us[r]:
                break
        p = np.where(np.arange(len(es)) < r, us, es * scale)
        out[i, order] = p
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs and sizes")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    import torch

    import numeric as nm
    import numeric.torch as rt

    try:
        import entmax
    except ImportError:
        entmax = None
    torch.set_num_threads(torch.get_num_threads())
    sizes = SIZES[:2] if args.quick else SIZES
    repeat = 3 if args.quick else 5
    min_s = 0.05 if args.quick else MIN_SECONDS
    rows_out = []

    def timed(fn):
        return median_seconds(fn, repeat=repeat, min_seconds=min_s)

    def fwd_bwd(f, x, grad):
        def run():
            xx = x.detach().requires_grad_()
            f(xx).backward(grad)
        return run

    def against_peer(case, n, rows, ours, peer, x, grad, truth):
        """A row of figures: ours and the peer's (``None``: not installed) forward and forward+backward times
        on ``x``, each one's largest error against ``truth``."""
        row = {"case": case, "n": n, "rows": rows, "ours_fwd_ms": 1e3 * timed(lambda: ours(x)),
               "ours_fwdbwd_ms": 1e3 * timed(fwd_bwd(ours, x, grad)),
               "ours_err": float((ours(x).double() - truth).abs().max())}
        if peer is not None:
            row.update(peer_fwd_ms=1e3 * timed(lambda: peer(x)), peer_fwdbwd_ms=1e3 * timed(fwd_bwd(peer, x, grad)),
                       peer_err=float((peer(x).double() - truth).abs().max()))
            row["fwd_ratio"] = row["ours_fwd_ms"] / row["peer_fwd_ms"]
            row["fwdbwd_ratio"] = row["ours_fwdbwd_ms"] / row["peer_fwdbwd_ms"]
        rows_out.append(row)
        print(row, flush=True)

    # ---------------------------------------------------------------- budget sparsemax, normmax
    for n in sizes:
        rows = (1 << 17) // n
        g = torch.Generator().manual_seed(n)
        x = torch.randn(rows, n, generator=g)
        grad = torch.randn(rows, n, generator=g)
        k = 4.0
        against_peer("budget sparsemax k=4", n, rows, lambda a: rt.sparsemax(a, upper=1.0, total=k),
                     None if entmax is None else lambda a: entmax.budget_bisect(a, k), x, grad,
                     rt.sparsemax(x.double(), upper=1.0, total=k))
        for alpha in (1.5, 2.0, 4.0):
            against_peer(f"normmax alpha={alpha}", n, rows, lambda a: rt.normmax(a, alpha),
                         None if entmax is None else lambda a: entmax.normmax_bisect(a, alpha), x, grad,
                         rt.normmax(x.double(), alpha))

    # ---------------------------------------------------------------- the price of the box
    typed = typed_modules()
    maps = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax", {"alpha": 0.6})]
    maps += [(name, {}) for name in typed]
    n = 1024
    rows = 128
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n, generator=g)
    grad = torch.randn(rows, n, generator=g)
    u = torch.full((n,), 1.5 / n)
    for name, params in maps:
        module = typed.get(name, name)
        m, mn = rt.get_map(module, **params), nm.get_map(module, **params)
        plain_t = timed(fwd_bwd(lambda a: m(a), x, grad))
        box_t = timed(fwd_bwd(lambda a: m(a, upper=u), x, grad))
        xn, un = x.numpy(), u.numpy()
        plain_n = timed(lambda: mn(xn))
        box_n = timed(lambda: mn(xn, upper=un))
        saturated = float((m(x, upper=u) >= u * (1 - 1e-6)).float().sum(-1).mean())
        row = {"case": "box price", "map": name + "".join(f" {k}={v}" for k, v in params.items()), "n": n,
               "rows": rows, "saturated_per_row": saturated,
               "torch_plain_ms": 1e3 * plain_t, "torch_box_ms": 1e3 * box_t, "torch_ratio": box_t / plain_t,
               "numpy_plain_ms": 1e3 * plain_n, "numpy_box_ms": 1e3 * box_n, "numpy_ratio": box_n / plain_n}
        rows_out.append(row)
        print(row, flush=True)

    # ---------------------------------------------------------------- constrained softmax, sort-based
    for n in sizes[:2]:
        rows = 256
        rng = np.random.default_rng(n)
        x = rng.standard_normal((rows, n))
        u = rng.uniform(0.5, 3.0, (rows, n)) / n
        ours = nm.softmax(x, upper=u)
        sort = _sort_constrained_softmax(x, u)
        row = {"case": "constrained softmax vs sort (NumPy float64)", "n": n, "rows": rows,
               "ours_ms": 1e3 * timed(lambda: nm.softmax(x, upper=u)),
               "sort_ms": 1e3 * timed(lambda: _sort_constrained_softmax(x, u)),
               "max_diff": float(np.abs(ours - sort).max())}
        row["ratio"] = row["ours_ms"] / row["sort_ms"]
        rows_out.append(row)
        print(row, flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    (out / "box.json").write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=1))
    lines = ["| case | n | ours (ms) | peer (ms) | ratio | error / note |", "|---|---|---|---|---|---|"]
    for r in rows_out:
        if r["case"].startswith(("budget", "normmax")):
            lines.append(f"| {r['case']} fwd | {r['n']} | {r['ours_fwd_ms']:.2f} | {r.get('peer_fwd_ms', float('nan')):.2f} "
                         f"| {r.get('fwd_ratio', float('nan')):.2f} | ours {r['ours_err']:.1e}, entmax {r.get('peer_err', float('nan')):.1e} |")
            lines.append(f"| {r['case']} fwd+bwd | {r['n']} | {r['ours_fwdbwd_ms']:.2f} | "
                         f"{r.get('peer_fwdbwd_ms', float('nan')):.2f} | {r.get('fwdbwd_ratio', float('nan')):.2f} | |")
        elif r["case"] == "box price":
            lines.append(f"| box price {r['map']} (torch fwd+bwd; NumPy fwd) | {r['n']} | {r['torch_box_ms']:.2f}; "
                         f"{r['numpy_box_ms']:.2f} | {r['torch_plain_ms']:.2f}; {r['numpy_plain_ms']:.2f} (plain) | "
                         f"{r['torch_ratio']:.2f}; {r['numpy_ratio']:.2f} | {r['saturated_per_row']:.0f} saturated a row |")
        else:
            lines.append(f"| {r['case']} | {r['n']} | {r['ours_ms']:.2f} | {r['sort_ms']:.2f} | {r['ratio']:.2f} "
                         f"| max diff {r['max_diff']:.1e} |")
    (out / "box.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
