"""The scaling sweep: profile one worker, then measure real throughput for K workers per architecture.

`python -m testbed.dparch.measure [--out docs/data/predict-measured.json]` runs the full sweep that
docs/predict.md and the accuracy table in docs/BENCHMARKS.md are built from (K = 1…8 × ring,
ps-sync, ps-async; about 15 minutes on the 2-core box). It is deliberately not part of `make test`.
Every (architecture, K) is measured `--repeats` times in shuffled order and the median kept; the
profile is taken before the first and after every repetition and merged, so load from neighbours on
the shared machine shows up in the profile and in random runs rather than in a block of K.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.dparch.run import ARCHS, RunSpec, profile_doc, run_pool, throughput

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "data" / "predict-measured.json"
# Steps per run: enough measured steps for a stable mean, few enough that K = 8 with a parameter
# server (about 1 s per step) finishes in ~15 s.
STEPS = {"ring": 14, "ps-sync": 8, "ps-async": 12}
WARMUP = {"ring": 3, "ps-sync": 2, "ps-async": 2}


def merge_profiles(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One profile from several runs of the same job: step samples pooled, scalars averaged."""
    if len(docs) == 1:
        return docs[0]
    out = json.loads(json.dumps(docs[0]))
    fwd = [row for d in docs for row in d["steps"]["forward_s"]]
    bwd = [row for d in docs for row in d["steps"]["backward_s"]]
    out["steps"] = {"forward_s": fwd, "backward_s": bwd}
    for i, layer in enumerate(out["layers"]):
        layer["forward_s"] = statistics.fmean(r[i] for r in fwd)
        layer["backward_s"] = statistics.fmean(r[i] for r in bwd)
    for key in ("update_s", "accumulate_s"):
        out[key] = statistics.fmean(d[key] for d in docs)
    for key in ("efficiency", "latency_s"):
        out["link"][key] = statistics.fmean(d["link"][key] for d in docs)
        out["link"]["allreduce"][key] = statistics.fmean(d["link"]["allreduce"][key] for d in docs)
    out["meta"]["merged_from"] = len(docs)
    return out


def sweep(base: RunSpec, archs: Sequence[str], workers: Sequence[int], *, profile: bool = True,
          repeats: int = 1, steps: int | None = None, seed: int = 0, log: Callable[[str], None] = print,
          save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Profile and measure every (architecture, K) `repeats` times; returns the data document.

    The jobs of each repetition run in a shuffled order and a profile is taken before the first and
    after every repetition, all merged: a burst of load from a neighbour on the shared machine then
    hits random (architecture, K) pairs and the profile alike, and the per-pair median drops it.

    Args:
        base: settings shared by every run (rate, CPU cap, model).
        archs: architectures to measure.
        workers: worker counts.
        profile: take single-worker profiles (otherwise only the runs).
        repeats: runs per (architecture, K); the reported throughput is their median.
        steps: measured steps per run (default `STEPS` per architecture, warm-up `WARMUP`; with
            `steps` the warm-up is `base.warmup`).
        seed: seed of the shuffle.
        log: progress lines.
        save: called with the finished document.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    doc: dict[str, Any] = {"format": "failslow-dp-measured/2", "spec": base.__dict__, "repeats": repeats,
                           "profiles": [], "runs": []}
    prof = replace(base, arch="profile", workers=1, steps=30, warmup=3)
    rng = random.Random(seed)
    specs = [prof] if profile else []
    for _ in range(repeats):
        rep = [replace(base, arch=arch, workers=k, steps=steps or STEPS[arch],
                       warmup=base.warmup if steps else WARMUP[arch]) for arch in archs for k in workers]
        rng.shuffle(rep)
        specs += rep
        if profile:
            specs.append(prof)
    t = time.monotonic()
    jobs = run_pool(specs)
    log(f"{len(specs)} runs in {time.monotonic() - t:.0f}s")
    samples: dict[tuple[str, int], list[float]] = {}
    details: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for spec, job in zip(specs, jobs, strict=True):
        if spec.arch == "profile":
            doc["profiles"].append(profile_doc(job))
            continue
        samples.setdefault((spec.arch, spec.workers), []).append(throughput(job))
        details.setdefault((spec.arch, spec.workers), []).append(_detail(job))
    for arch in archs:
        for k in workers:
            xs = samples[(arch, k)]
            doc["runs"].append({"arch": arch, "workers": k, "samples_per_s": statistics.median(xs),
                                "repeats_samples_per_s": xs, "steps": steps or STEPS[arch],
                                "warmup": base.warmup if steps else WARMUP[arch], "detail": details[(arch, k)]})
            log(f"{arch:8s} K={k}: {statistics.median(xs):9.1f} samples/s  (runs: "
                + ", ".join(f"{x:.0f}" for x in xs) + ")")
    if profile:
        doc["profile"] = merge_profiles(doc["profiles"])
    if save:
        save(doc)
    return doc


def _detail(job: dict[str, Any]) -> dict[str, Any]:
    """The per-rank timings worth keeping (diagnostics for the docs), compactly."""
    out: dict[str, Any] = {}
    for rank, r in job["ranks"].items():
        if "phases_s" in r:
            out[rank] = {"phases_mean_s": [statistics.fmean(p[i] for p in r["phases_s"]) for i in range(3)]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.dparch.measure", description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--arch", default=",".join(ARCHS))
    ap.add_argument("--workers", default="1-8")
    ap.add_argument("--rate", default=RunSpec.rate)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    lo, _, hi = args.workers.partition("-")
    workers = list(range(int(lo), int(hi or lo) + 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(d: dict[str, Any]) -> None:
        args.out.write_text(json.dumps(d, indent=1) + "\n")

    sweep(RunSpec(arch="ring", workers=1, rate=args.rate), args.arch.split(","), workers, save=save,
          repeats=args.repeats,
          log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
