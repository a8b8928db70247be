"""regattn against its peers, side by side in one run: a Markdown table, a JSON file and a plot.

Run (after `make setup`, which installs torch (its CPU wheel: see the README), and `pip install -e '.[bench]' entmax`):

    python benchmarks/run.py [--quick] [--out benchmarks/results]

The maps include the typed maps of every kind (:data:`_typed.KINDS`: user
regularizers whose link numeric solves for), NumPy forward on the same scores,
in a table of their own: each map's kind and rule (the generated module's
``THRESHOLD/LINK_FORM``) beside it, its time over numeric's entmax15's and its
speed-up over the entmax package's ``entmax_bisect`` (alpha = 1.3); no peer has
them.  Their goals (issue 46) are checked by ``bench_frameworks.py``, on one
thread and (512, n) scores.

Every figure is a ratio of medians measured in this run, float32, with torch
limited to the same 2 threads (regattn's maps split inputs of 2**17 scores and
more into two halves of rows on two threads).  A missing peer is reported, not
fatal.  The load average before and after the run is recorded: another process
on a 2-core machine slows every multi-threaded figure (torch's and ours).
Targets (issue "Benchmarks against the peers") are checked and reported met or
missed; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import numeric as nm
from _timing import median_seconds
from _typed import KINDS, kind_modules, rule

THREADS = 2


def peers():
    found, missing = {}, []
    try:
        import torch

        torch.set_num_threads(THREADS)
        found["torch"] = torch
    except ImportError:
        missing.append("torch (pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)")
    try:
        import entmax

        found["entmax"] = entmax
    except ImportError:
        missing.append("entmax (pip install entmax)")
    try:
        import scipy.special

        found["scipy"] = scipy.special
    except ImportError:
        missing.append("scipy")
    return found, missing


def maps_rows(found, sizes, repeat):
    rows = []
    typed = kind_modules()
    for n in sizes:
        x = np.random.default_rng(n).standard_normal((max(1, 2**20 // n), n)).astype(np.float32)
        ours = {
            "softmax": median_seconds(lambda: nm.softmax(x), repeat),
            "sparsemax": median_seconds(lambda: nm.sparsemax(x), repeat),
            "entmax15": median_seconds(lambda: nm.entmax15(x), repeat),
            "entmax(1.3)": median_seconds(lambda: nm.entmax(x, 1.3), repeat),
        }
        theirs = {}
        if "torch" in found:
            xt = found["torch"].from_numpy(x)
            theirs["softmax"] = ("torch.softmax", median_seconds(lambda: found["torch"].softmax(xt, -1), repeat))
            if "entmax" in found:
                e = found["entmax"]
                theirs["sparsemax"] = ("entmax.sparsemax", median_seconds(lambda: e.sparsemax(xt, dim=-1), repeat))
                theirs["entmax15"] = ("entmax.entmax15", median_seconds(lambda: e.entmax15(xt, dim=-1), repeat))
                theirs["entmax(1.3)"] = ("entmax.entmax_bisect", median_seconds(lambda: e.entmax_bisect(xt, 1.3, dim=-1), max(3, repeat // 2)))
        if "scipy" in found:
            rows.append(dict(what="softmax", n=n, peer="scipy.special.softmax", ours_ms=ours["softmax"] * 1e3,
                             peer_ms=median_seconds(lambda: found["scipy"].softmax(x, axis=-1), repeat) * 1e3))
        for key, (peer, t) in theirs.items():
            rows.append(dict(what=key, n=n, peer=peer, ours_ms=ours[key] * 1e3, peer_ms=t * 1e3))
        # typed maps of every kind (_typed.KINDS): no peer has them; beside our entmax15 and the entmax package's bisection
        for name, module in typed.items():
            m = nm.get_map(module)
            t = median_seconds(lambda: m(x), repeat)
            about = dict(map=name, expr=KINDS[name][0], kind=KINDS[name][1], rule=rule(module))
            rows.append(dict(what=f"typed {name}", n=n, peer="numeric entmax15", ours_ms=t * 1e3, peer_ms=ours["entmax15"] * 1e3,
                             **about))
            if "entmax(1.3)" in theirs:
                rows.append(dict(what=f"typed {name}", n=n, peer="entmax.entmax_bisect", ours_ms=t * 1e3,
                                 peer_ms=theirs["entmax(1.3)"][1] * 1e3, **about))
    return rows


def attention_rows(found, repeat, length=2048):
    rows = []
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, length, 64)).astype(np.float32) for _ in range(3))
    flops = 2 * 2 * 8 * length * length * 64  # q k^T and p v
    a2 = rng.standard_normal((8 * length, 64)).astype(np.float32)
    b2 = rng.standard_normal((64, length)).astype(np.float32)
    matmul = median_seconds(lambda: [a2 @ b2, (a2 @ b2)[:, :64]], repeat)  # same multiply-adds as the two products
    times = {}
    for causal in (False, True):
        times[causal] = median_seconds(lambda: nm.attention(q, k, v, causal=causal), repeat)
        dout = rng.standard_normal(q.shape).astype(np.float32)
        if causal:
            times["backward"] = median_seconds(lambda: nm.attention_backward(q, k, v, dout, causal=True), max(3, repeat // 2))
        if "torch" in found:
            torch = found["torch"]
            qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
            t = median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), repeat)
            rows.append(dict(what=f"attention{' causal' if causal else ''}", n=length, peer="torch SDPA",
                             ours_ms=times[causal] * 1e3, peer_ms=t * 1e3))
    rows.append(dict(what="attention", n=length, peer="np.matmul, same shapes", ours_ms=times[False] * 1e3,
                     peer_ms=matmul * 1e3, note=f"{flops / times[False] / 1e9:.1f} GFLOP/s"))
    return rows, times


def layer_rows(found, repeat, length=1024, embed=512, heads=8):
    """Multi-head self-attention layer forward, float32, against torch.nn.MultiheadAttention."""
    rows = []
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, length, embed)).astype(np.float32)
    for causal in (False, True):
        layer = nm.MultiHeadAttention(embed, heads, causal=causal, dtype="float32", seed=0)
        ours = median_seconds(lambda: layer.forward(x, need_weights=False), repeat)
        if "torch" in found:
            torch = found["torch"]
            mha = torch.nn.MultiheadAttention(embed, heads, batch_first=True)
            xt = torch.from_numpy(x)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(length) if causal else None
            with torch.no_grad():
                peer = median_seconds(lambda: mha(xt, xt, xt, attn_mask=mask, need_weights=False, is_causal=causal), repeat)
            rows.append(dict(what=f"MultiHeadAttention{' causal' if causal else ''} E={embed} H={heads}", n=length,
                             peer="torch.nn.MultiheadAttention", ours_ms=ours * 1e3, peer_ms=peer * 1e3))
    return rows


def generate_seconds():
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "derive.cli", "generate", "--out", tmp], check=True, capture_output=True)
        return time.perf_counter() - start


def targets(rows, times, gen):
    def ratio(what, n, peer_prefix):
        for r in rows:
            if r["what"] == what and r["n"] == n and r["peer"].startswith(peer_prefix):
                return r["peer_ms"] / r["ours_ms"]
        return None

    out = []
    for n in (64, 1024, 16384):
        out.append((f"sparsemax forward n={n}: >= 4x entmax.sparsemax", ratio("sparsemax", n, "entmax"), 4.0))
        out.append((f"entmax alpha=1.3 n={n}: >= 10x entmax_bisect", ratio("entmax(1.3)", n, "entmax"), 10.0))
        out.append((f"softmax n={n}: >= 0.5x torch.softmax speed", ratio("softmax", n, "torch"), 0.5))
    out.append(("attention L=2048: >= 1.5x torch SDPA", ratio("attention", 2048, "torch"), 1.5))
    out.append(("attention causal L=2048: >= 1.5x torch SDPA", ratio("attention causal", 2048, "torch"), 1.5))
    out.append(("attention: >= 50% of the matmul FLOP rate", ratio("attention", 2048, "np.matmul"), 0.5))
    out.append(("causal / non-causal time <= 0.6", times[True] / times[False], None, 0.6))
    out.append(("causal backward / causal forward <= 3", times["backward"] / times[True], None, 3.0))
    out.append(("regattn generate, all built-ins <= 10 s", gen, None, 10.0))
    checked = []
    for item in out:
        if len(item) == 3:
            name, value, goal = item
            met = None if value is None else value >= goal
        else:
            name, value, _, goal = item
            met = value <= goal
        checked.append(dict(target=name, value=value, met=met))
    return checked


def typed_table(rows):
    """The typed maps' rows (those with a ``map``) as one Markdown table, a line per map and n with its kind and rule
    beside it: its time, that time over numeric's entmax15's, and its speed-up over the entmax package's
    ``entmax_bisect`` (alpha = 1.3)."""
    lines = []
    for name, n in dict.fromkeys((r["map"], r["n"]) for r in rows if "map" in r):
        by_peer = {r["peer"]: r for r in rows if r.get("map") == name and r["n"] == n}
        r = next(iter(by_peer.values()))
        base, bisect = by_peer.get("numeric entmax15"), by_peer.get("entmax.entmax_bisect")
        over = "" if base is None else f"{base['ours_ms'] / base['peer_ms']:.2f}x"
        speedup = "" if bisect is None else f"{bisect['peer_ms'] / bisect['ours_ms']:.2f}x"
        lines.append(f"| {name} | {r['kind']} | {r['rule']} | {n} | {r['ours_ms']:.2f} | {over} | {speedup} |")
    if not lines:
        return []
    return ["Typed maps of every kind (`_typed.KINDS`), NumPy forward on the same scores:", "",
            "| typed map | kind | rule | n | ms | time / numeric entmax15's | speed-up over entmax.entmax_bisect |",
            "|---|---|---|---:|---:|---:|---:|", *lines]


def write(out_dir: Path, rows, checked, missing, load=None):
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(machine=f"{platform.machine()}, {os.cpu_count()} cores", python=platform.python_version(),
                numpy=np.__version__, threads=THREADS, missing_peers=missing, load_average=load)
    (out_dir / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows, targets=checked), indent=2) + "\n")
    lines = ["| what | n | peer | regattn ms | peer ms | speed-up |", "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        if "map" in r:
            continue
        lines.append(f"| {r['what']} | {r['n']} | {r['peer']} | {r['ours_ms']:.2f} | {r['peer_ms']:.2f} | "
                     f"{r['peer_ms'] / r['ours_ms']:.2f}x{' (' + r['note'] + ')' if r.get('note') else ''} |")
    typed = typed_table(rows)
    if typed:
        lines += ["", *typed]
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    for c in checked:
        value = "n/a" if c["value"] is None else f"{c['value']:.2f}"
        lines.append(f"| {c['target']} | {value} | {'-' if c['met'] is None else ('yes' if c['met'] else 'NO')} |")
    if missing:
        lines += ["", "Missing peers: " + ", ".join(missing)]
    if load:
        lines += ["", f"1-minute load average before / after the run: {load[0]:.2f} / {load[1]:.2f}"]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = [r for r in rows if r["peer"] != "numeric entmax15"]  # (the peers; a typed map beside entmax_bisect)
        fig, ax = plt.subplots(figsize=(max(8, 0.18 * len(shown)), 4))
        labels = [f"{r['what']}\nn={r['n']}\nvs {r['peer']}" for r in shown]
        ax.bar(range(len(shown)), [r["peer_ms"] / r["ours_ms"] for r in shown])
        ax.axhline(1, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(shown)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("speed-up of regattn (peer time / regattn time)")
        fig.tight_layout()
        fig.savefig(out_dir / "speedups.png", dpi=120)
    except ImportError:
        pass
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    found, missing = peers()
    for m in missing:
        print(f"peer missing: {m}")
    rows = maps_rows(found, (64, 1024, 16384), repeat)
    att_rows, times = attention_rows(found, repeat)
    rows += att_rows
    small, _ = attention_rows(found, repeat, length=512)
    rows += [row for row in small if row["peer"] == "torch SDPA"]
    rows += layer_rows(found, repeat)
    checked = targets(rows, times, generate_seconds())
    load = None if load_before is None else (load_before, os.getloadavg()[0])
    print(write(args.out, rows, checked, missing, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
