"""Throughput prediction: accuracy against the measured testbed sweep, and model speed.

Accuracy is recomputed from data: the profile and the measured throughput saved by
`python -m testbed.dparch.measure` in docs/data/predict-measured.json are fed to today's models, and
the table plus docs/predict-accuracy.png are written from that. Speed is measured in this run: the
fine-grained simulation of 8 workers × 100 steps × 50 layers, and one coarse-model evaluation, with
the simulation as the peer of the closed forms and exact MVA as the peer of Bard–Schweitzer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from failslow.predict import parse_profile, predict, simulate
from failslow.predict.coarse import ps_async, ps_sync_step_time, ring_step_time
from failslow.predict.profile import LayerProfile, Profile

TITLE = "Throughput prediction (failslow predict)"
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "predict-measured.json"
PLOT = ROOT / "docs" / "predict-accuracy.png"
ARCHS = ("ring", "ps-sync", "ps-async")
MODELS = ("coarse", "fine")


def accuracy(doc: dict[str, Any]) -> tuple[dict[tuple[str, str], dict[int, tuple[float, float]]], Profile]:
    """(arch, model) → K → (measured, predicted) samples/s for every measured run."""
    prof = parse_profile(doc["profile"])
    measured: dict[str, dict[int, float]] = {}
    for r in doc["runs"]:
        measured.setdefault(r["arch"], {})[int(r["workers"])] = float(r["samples_per_s"])
    out: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for arch, meas in measured.items():
        ks = sorted(meas)
        for model in MODELS:
            pred = predict(prof, ks, arch=arch, model=model, steps=200, seed=0)
            out[(arch, model)] = {k: (meas[k], pred.throughput[k]) for k in ks}
    return out, prof


def _plot(acc: dict[tuple[str, str], dict[int, tuple[float, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = [a for a in ARCHS if (a, "coarse") in acc]
    fig, axes = plt.subplots(1, len(archs), figsize=(4.2 * len(archs), 3.6), squeeze=False)
    for ax, arch in zip(axes[0], archs, strict=True):
        ks = sorted(acc[(arch, "coarse")])
        ax.plot(ks, [acc[(arch, "coarse")][k][0] for k in ks], "ko-", label="measured (testbed)")
        ax.plot(ks, [acc[(arch, "coarse")][k][1] for k in ks], "s--", label="coarse model")
        ax.plot(ks, [acc[(arch, "fine")][k][1] for k in ks], "^:", label="fine simulation")
        ax.set_title(arch)
        ax.set_xlabel("workers K")
        ax.set_ylabel("samples / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def _timeit(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _bench_profile(layers: int) -> Profile:
    rng = np.random.default_rng(0)
    lys = tuple(LayerProfile(f"l{i}", int(rng.integers(50_000, 500_000)), float(rng.uniform(1e-3, 4e-3)),
                             float(rng.uniform(2e-3, 8e-3))) for i in range(layers))
    base = Profile(layers=lys, batch_size=64, bandwidth_bytes_per_s=25e6, latency_s=2e-4)
    f = base.forward_s * rng.lognormal(0, 0.1, (50, layers))
    b = base.backward_s * rng.lognormal(0, 0.1, (50, layers))
    return Profile(layers=lys, batch_size=64, bandwidth_bytes_per_s=25e6, latency_s=2e-4, update_s=0.01,
                   accumulate_s=0.002, step_forward_s=f, step_backward_s=b)


def run() -> str:
    lines: list[str] = []
    if DATA.exists():
        doc = json.loads(DATA.read_text())
        acc, prof = accuracy(doc)
        _plot(acc)
        ks = sorted({k for v in acc.values() for k in v})
        lines += [
            "### Prediction error against the measured testbed",
            "",
            f"Data: `{DATA.relative_to(ROOT)}` (measured by `python -m testbed.dparch.measure`: each worker and "
            f"the server in its own netns behind `tc tbf {doc['spec']['rate']}` on both link ends, every process "
            f"capped at {doc['spec']['cpu_cap']:.3f} CPU, MLP {prof.n_layers} layers, "
            f"{prof.model_bytes / 1e6:.2f} MB of parameters, batch {prof.batch_size}/worker). Predictions are "
            "recomputed now from the profile in that file (two single-worker profiling runs merged). Error = "
            "predicted / measured − 1. Plot: `docs/predict-accuracy.png`.",
            "",
            "| arch | model | " + " | ".join(f"K={k}" for k in ks) + " | mean abs | max abs |",
            "|---|---|" + "---|" * len(ks) + "---|---|",
        ]
        for arch in ARCHS:
            if (arch, "coarse") not in acc:
                continue
            meas = acc[(arch, "coarse")]
            lines.append(f"| {arch} | measured | " + " | ".join(f"{meas[k][0]:.0f}" if k in meas else "–"
                                                             for k in ks) + " | | |")
            for model in MODELS:
                pts = acc[(arch, model)]
                err = {k: pts[k][1] / pts[k][0] - 1 for k in pts}
                cells = " | ".join(f"{pts[k][1]:.0f} ({100 * err[k]:+.1f}%)" if k in pts else "–" for k in ks)
                mean_abs = 100 * float(np.mean(np.abs(list(err.values()))))
                max_abs = 100 * float(np.max(np.abs(list(err.values()))))
                lines.append(f"| {arch} | {model} | {cells} | {mean_abs:.1f}% | {max_abs:.1f}% |")
        all_err = {m: [abs(v[1] / v[0] - 1) for (a, mm), pts in acc.items() if mm == m for v in pts.values()]
                   for m in MODELS}
        lines += ["", "Over all architectures and K: " + "; ".join(
            f"{m} mean {100 * np.mean(e):.1f}%, max {100 * np.max(e):.1f}%" for m, e in all_err.items()) + "."]
    else:
        lines += [f"_No measured data at `{DATA.relative_to(ROOT)}`: run `python -m testbed.dparch.measure`._"]

    # --- speed ----------------------------------------------------------------------------------
    p = _bench_profile(50)
    lines += ["", "### Speed", "", "| what | time | peer in this run | ratio |", "|---|---|---|---|"]
    sims = {}
    for arch in ARCHS:
        res = simulate(p, 8, arch, steps=100, warmup=5)  # type: ignore[arg-type]
        t = _timeit(lambda arch=arch: simulate(p, 8, arch, steps=100, warmup=5), 3)  # type: ignore[misc]
        sims[arch] = t
        lines.append(f"| fine simulation, {arch}, 8 workers × 100 steps × 50 layers | {t * 1e3:.0f} ms "
                     f"({res.events / t / 1e3:.0f}k events/s) | | |")
    n = 200
    coarse = {
        "ring": _timeit(lambda: [ring_step_time(p, 8) for _ in range(n)], 3) / n,
        "ps-sync": _timeit(lambda: [ps_sync_step_time(p, 8) for _ in range(n)], 3) / n,
        "ps-async": _timeit(lambda: [ps_async(p, 8) for _ in range(20)], 3) / 20,
    }
    for arch, t in coarse.items():
        lines.append(f"| coarse model, {arch}, K=8, one evaluation | {t * 1e6:.0f} µs | fine simulation "
                     f"{sims[arch] * 1e3:.0f} ms | {sims[arch] / t:.0f}× faster |")
    exact = _timeit(lambda: ps_async(p, 10, exact_max=10), 3)
    approx = _timeit(lambda: ps_async(p, 10, exact_max=0), 3)
    big = _timeit(lambda: ps_async(p, 256), 3)
    lines.append(f"| async MVA, K=10, Bard–Schweitzer | {approx * 1e3:.2f} ms | exact MVA (2^10 populations) "
                 f"{exact * 1e3:.1f} ms | {exact / approx:.0f}× faster |")
    lines.append(f"| async MVA, K=256, Bard–Schweitzer | {big * 1e3:.1f} ms | | |")
    lines += ["", "Command: `.venv/bin/python -m bench predict` (the sweep itself: "
              "`sudo .venv/bin/python -m testbed.dparch.measure`, ~15 min, not in `make test`)."]
    return "\n".join(lines)
