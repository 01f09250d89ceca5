"""The scaling sweep: profile one worker, then measure real throughput for K workers per architecture.

`python -m testbed.dparch.measure --out FILE` runs the sweep that docs/predict.md and the accuracy
tables in docs/BENCHMARKS.md are built from (K = 1…8 × ring, ps-sync, ps-async, or one architecture
per hold with `--arch`; about 6 minutes per architecture on the 2-core box). It is deliberately not
part of `make test`. Every (architecture, K) is measured `--repeats` times in shuffled order and the
median kept; the profile is taken before the first and after every repetition and merged, so load
from neighbours on the shared machine shows up in the profile and in random runs rather than in a
block of K. The ring's network microbenchmark is run in slices at the same points, its rounds pooled
per K. A FILE ending in `.xz` is written as xz-compressed compact JSON (how docs/data/ stores it),
any other as indented JSON; `--combine` and `--remerge` read either.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from testbed.dparch.run import ARCHS, RunSpec, lite_steps, profile_doc, run_pool, throughput

# Steps per run. With 14/8/12 measured steps (1.3 s for ring at K = 1) one neighbour's burst of a
# second moves a whole run. Per-step wall times under a 10 ms-period cap have a CV
# of ~15-20 % (a 13 ms step of CPU work straddles 8-9 quota periods), so ~30 measured steps bring the
# run mean to ~3 %; parameter-server steps are 2-9x longer (many quota periods each), so fewer do,
# and a K = 8 sync run (about 0.9 s per step) takes ~13 s.
STEPS = {"ring": 30, "ps-sync": 12, "ps-async": 20}
# The first steps pay connection set-up and cold caches after the previous job (3-5 steps measured
# above the steady state); a few more than needed costs little.
WARMUP = {"ring": 5, "ps-sync": 3, "ps-async": 3}
PROFILE_STEPS = 40
# Short single-worker profile next to every run (back to back + after idle): ~3 s.
LITE_STEPS = 12
# Network microbenchmark rounds per K (after 2 warm-up rounds).
NET_ROUNDS = 8


def merge_profiles(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One profile from several runs of the same job: step samples pooled, scalars averaged."""
    if len(docs) == 1:
        return docs[0]
    out = json.loads(json.dumps(docs[0]))
    # Step samples are pooled after scaling each profiling run to the pooled median step: the level
    # of a run follows the machine's state (neighbours' load moved it by up to 1.6x within one quiet-
    # lock hold), which is common to all workers of a later run, whereas the step-to-step jitter
    # within a run is what is independent per worker — the part a barrier's max over K must see.
    for fkey, bkey in (("forward_s", "backward_s"), ("idle_forward_s", "idle_backward_s"),
                       ("net_forward_s", "net_backward_s"), ("ring_forward_s", "ring_backward_s")):
        if not all(fkey in d["steps"] for d in docs):
            continue
        tot = [np.asarray(d["steps"][fkey]).sum(axis=1) + np.asarray(d["steps"][bkey]).sum(axis=1) for d in docs]
        level = float(np.median(np.concatenate(tot)))
        scale = [level / float(np.median(t)) for t in tot]
        rows = [([x * c for x in fr], [x * c for x in br], c * float(t))
                for d, c, ts in zip(docs, scale, tot, strict=True)
                for fr, br, t in zip(d["steps"][fkey], d["steps"][bkey], ts, strict=True)]
        # Long stalls stay in: the barrier's expected max over K is tail-sensitive and the runs have
        # such stalls too (dropping one 741 ms after-idle step among 148 around 80 ms moved the ring
        # predictions for K = 3…7 by +5…9 %, away from the measurement).
        out["steps"][fkey] = [fr for fr, _, _ in rows]
        out["steps"][bkey] = [br for _, br, _ in rows]
        if fkey == "ring_forward_s":
            # The peer's paired steps get their run's scale too (the level is common to both members).
            if all(len(d["steps"].get("ring_peer_step_s", [])) == len(d["steps"][fkey]) for d in docs):
                out["steps"]["ring_peer_step_s"] = [x * c for d, c in zip(docs, scale, strict=True)
                                                    for x in d["steps"]["ring_peer_step_s"]]
            else:
                out["steps"].pop("ring_peer_step_s", None)
    fwd, bwd = out["steps"]["forward_s"], out["steps"]["backward_s"]
    # Medians throughout: one profiling run during a neighbour's burst must not move the profile.
    for i, layer in enumerate(out["layers"]):
        layer["forward_s"] = statistics.median(r[i] for r in fwd)
        layer["backward_s"] = statistics.median(r[i] for r in bwd)
    for key in ("update_s", "accumulate_s"):
        out[key] = statistics.median(d[key] for d in docs)
    for key in ("efficiency", "latency_s"):
        out["link"][key] = statistics.median(d["link"][key] for d in docs)
        out["link"]["allreduce"][key] = statistics.median(d["link"]["allreduce"][key] for d in docs)
    out["meta"]["merged_from"] = len(docs)
    return out


def sweep(base: RunSpec, archs: Sequence[str], workers: Sequence[int], *, profile: bool = True,
          repeats: int = 1, steps: int | None = None, seed: int = 0, log: Callable[[str], None] = print,
          save: Callable[[dict[str, Any]], None] | None = None, net: bool = False,
          local: bool = False) -> dict[str, Any]:
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
        net: also run the network microbenchmarks (``net-ring`` for K ≥ 2 when ring is measured,
            ``net-ps`` when a parameter server is), stored under ``"net"``.
        local: take a short single-worker profile (``profile-lite``) before every run and after each
            repetition's last; each run records the indices of the ones around it
            (``local_profiles``), stored under ``"lite"``.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    doc: dict[str, Any] = {"format": "failslow-dp-measured/2", "spec": base.__dict__, "repeats": repeats,
                           "profiles": [], "runs": []}
    prof = replace(base, arch="profile", workers=1, steps=PROFILE_STEPS, warmup=3)
    rng = random.Random(seed)
    specs = [prof] if profile else []
    # The ring's network alone, per K (see `testbed.dparch.train.run_net_ring`): before the training
    # runs and again after every repetition, rounds pooled per K. Like the profile, so the hop cost is
    # read over the same minutes as the runs it predicts; one 8-round slice per hold left the K = 8
    # median anywhere between 114 and 209 ms from hold to hold.
    net_ring = [replace(base, arch="net-ring", workers=k, steps=NET_ROUNDS, warmup=2)
                for k in workers if k > 1] if net and "ring" in archs else []
    if net:
        specs += net_ring
        if any(a.startswith("ps") for a in archs):
            specs += [replace(base, arch="net-ps", workers=k, steps=NET_ROUNDS, warmup=2) for k in workers]
    lite = replace(base, arch="profile-lite", workers=1, steps=LITE_STEPS, warmup=2)
    for _ in range(repeats):
        rep = [replace(base, arch=arch, workers=k, steps=steps or STEPS[arch],
                       warmup=base.warmup if steps else WARMUP[arch]) for arch in archs for k in workers]
        rng.shuffle(rep)
        for spec in rep:
            # A short profile before every run (and one after the last): each run can be predicted
            # from the machine state it ran in.
            if local:
                specs.append(lite)
            specs.append(spec)
        if local:
            specs.append(lite)
        if profile:
            specs.append(prof)
        specs += net_ring
    t = time.monotonic()
    doc["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cpu0 = proc_stat()
    jobs = run_pool(specs)
    doc["host"] = host_share(cpu0, proc_stat())
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log(f"{len(specs)} runs in {time.monotonic() - t:.0f}s; host during the sweep: "
        + ", ".join(f"{k} {v:.1%}" for k, v in doc["host"].items()))
    samples: dict[tuple[str, int], list[float]] = {}
    details: dict[tuple[str, int], list[dict[str, Any]]] = {}
    around: dict[tuple[str, int], list[list[int]]] = {}
    lites: list[dict[str, Any]] = []
    last_run: tuple[str, int] | None = None
    for spec, job in zip(specs, jobs, strict=True):
        if spec.arch == "profile-lite":
            lites.append(lite_steps(job))
            if last_run is not None:  # the profile after the previous run
                around[last_run][-1].append(len(lites) - 1)
                last_run = None
            continue
        if spec.arch == "profile":
            doc["profiles"].append(profile_doc(job))
            continue
        if spec.arch == "net-ring":
            ring = doc.setdefault("net", {}).setdefault("ring", {})
            ring[str(spec.workers)] = pool_net_ring(ring.get(str(spec.workers)), net_ring_table(job))
            continue
        if spec.arch == "net-ps":
            doc.setdefault("net", {}).setdefault("ps", {})[str(spec.workers)] = net_ps_table(job)
            continue
        samples.setdefault((spec.arch, spec.workers), []).append(throughput(job))
        details.setdefault((spec.arch, spec.workers), []).append(job_detail(job))
        if local:
            around.setdefault((spec.arch, spec.workers), []).append([len(lites) - 1])
            last_run = (spec.arch, spec.workers)
    for arch in archs:
        for k in workers:
            xs = samples[(arch, k)]
            doc["runs"].append({"arch": arch, "workers": k, "samples_per_s": statistics.median(xs),
                                "repeats_samples_per_s": xs, "steps": steps or STEPS[arch],
                                "warmup": base.warmup if steps else WARMUP[arch], "detail": details[(arch, k)],
                                **({"local_profiles": around[(arch, k)]} if local else {})})
            log(f"{arch:8s} K={k}: {statistics.median(xs):9.1f} samples/s  (runs: "
                + ", ".join(f"{x:.0f}" for x in xs) + ")")
    if local:
        doc["lite"] = lites
    if profile:
        finish_profile(doc)
    if save:
        save(doc)
    return doc


def proc_stat() -> list[int]:
    """The machine's cumulative CPU ticks (user, nice, system, idle, iowait, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def host_share(before: list[int], after: list[int]) -> dict[str, float]:
    """What the machine's CPUs did between two `proc_stat` readings: busy, idle and stolen shares.

    Recorded with every sweep so that its spread can be read against the hypervisor's steal and the
    load it ran under (our own capped processes are at most 1.4 of the 2 CPUs, i.e. 70 % busy).
    """
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d) or 1
    idle = d[3] + d[4]
    return {"busy": (total - idle - d[7]) / total, "idle": idle / total, "steal": d[7] / total}


def net_ring_table(job: dict[str, Any]) -> dict[str, Any]:
    """All-reduce microbenchmark of one K: per round, the slowest member's time (when the step ends)."""
    per_rank = [r["allreduce_s"] for r in job["ranks"].values()]
    rounds = [max(ts) for ts in zip(*per_rank, strict=True)]
    out = {"bytes": _model_bytes(job), "allreduce_s": rounds, "median_s": statistics.median(rounds)}
    ranks = list(job["ranks"].values())
    if all("start" in r for r in ranks):
        # The collective itself: from the last member's entry to the last member's exit (a member that
        # enters early waits for the others; that skew is not the network's).
        pure = [max(ends) - max(starts) for starts, ends in
                zip(zip(*(r["start"] for r in ranks), strict=True), zip(*(r["end"] for r in ranks), strict=True),
                    strict=True)]
        out.update(pure_s=pure, pure_median_s=statistics.median(pure))
    if ranks and all(r.get("stagger_start") for r in ranks):
        # Entries staggered by one real compute step each: from the last entry to the last exit, and
        # how far the entries were spread (last entry less the mean entry, per round).
        rows = list(zip(zip(*(r["stagger_start"] for r in ranks), strict=True),
                        zip(*(r["stagger_end"] for r in ranks), strict=True), strict=True))
        stag = [max(ends) - max(starts) for starts, ends in rows]
        skew = [max(starts) - statistics.fmean(starts) for starts, _ in rows]
        out.update(stagger_pure_s=stag, stagger_pure_median_s=statistics.median(stag),
                   stagger_entry_skew_s=skew)
    return out


def pool_net_ring(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """One K's all-reduce microbenchmark slices (`net_ring_table`) as one table: rounds appended, medians
    over all of them; ``slices`` counts the slices pooled."""
    if old is None:
        return {**new, "slices": 1}
    out = {**old, "slices": old.get("slices", 1) + 1}
    for col in ("allreduce_s", "pure_s", "stagger_pure_s", "stagger_entry_skew_s"):
        if col in old and col in new:
            out[col] = old[col] + new[col]
        else:
            out.pop(col, None)
    for col, med in (("allreduce_s", "median_s"), ("pure_s", "pure_median_s"),
                     ("stagger_pure_s", "stagger_pure_median_s")):
        if col in out:
            out[med] = statistics.median(out[col])
        else:
            out.pop(med, None)
    return out


def net_ps_table(job: dict[str, Any]) -> dict[str, Any]:
    """Fan-out/fan-in microbenchmark of one K: per round, the sorted completion times from the start."""
    ranks = job["ranks"]
    k = job["spec"]["workers"]
    server = ranks["0"]
    fanout = [sorted(ranks[str(w)]["fanout_done"][i] - t0 for w in range(1, k + 1))
              for i, t0 in enumerate(server["fanout_start"])]
    # Fan-in from the latest sender's start: the server cannot receive what was not sent yet.
    fanin = [sorted(d - max(ranks[str(w)]["fanin_start"][i] for w in range(1, k + 1)) for d in done)
             for i, done in enumerate(server["fanin_done"])]
    med = lambda rows: [statistics.median(col) for col in zip(*rows, strict=True)]  # noqa: E731
    return {"bytes": _model_bytes(job), "fanout_s": fanout, "fanin_s": fanin,
            "fanout_median_s": med(fanout), "fanin_median_s": med(fanin)}


def finish_profile(doc: dict[str, Any]) -> None:
    """The sweep's profile: its profiling runs merged, plus the link figures of its microbenchmarks.

    Re-runnable on a saved sweep (``--remerge``) when the merging or the fits change: it only reads
    the raw profiling runs (``profiles``) and microbenchmark tables (``net``) of the document.
    """
    doc["profile"] = merge_profiles(doc["profiles"])
    if "ps" in doc.get("net", {}):
        doc["profile"]["link"]["sharing"] = sharing_fit(doc["net"]["ps"])
    ring_fit = ring_net_fit(doc.get("net", {}).get("ring", {}), doc["profile"]["link"]["bandwidth_bytes_per_s"])
    if ring_fit is not None:
        doc["profile"]["meta"]["allreduce_2rank"] = doc["profile"]["link"]["allreduce"]
        doc["profile"]["link"]["allreduce"] = ring_fit
    stag_fit = ring_net_fit(doc.get("net", {}).get("ring", {}), doc["profile"]["link"]["bandwidth_bytes_per_s"],
                            key="stagger_pure_median_s")
    if stag_fit is not None:
        doc["profile"]["link"]["allreduce_staggered"] = stag_fit


def ring_net_fit(net_ring: dict[str, Any], nominal: float, key: str = "pure_median_s") -> dict[str, float] | None:
    """One ring hop's payload rate and latency from the all-reduce microbenchmark at every K.

    Least squares of t(K) = 2(K−1)·M/(K·B_ring) + 2(K−1)·α_ring over the collective's own time (last
    entry to last exit, `net_ring_table`), K = 2…8: the per-hop cost as gloo really pays it at each ring
    size, instead of extrapolating a 2-rank calibration (whose intercept also held entry skew).
    None when fewer than two K were measured. `key` picks the column: ``stagger_pure_median_s`` fits the
    same hop to the rounds whose members each computed one step before entering.
    """
    pts = [(int(k), v["bytes"], v[key]) for k, v in net_ring.items() if key in v]
    if len(pts) < 2:
        return None
    x = np.array([[2 * (k - 1) * m / k, 2 * (k - 1)] for k, m, _ in pts], dtype=np.float64)
    y = np.array([t for *_, t in pts], dtype=np.float64)
    (inv_b, alpha), *_ = np.linalg.lstsq(x, y, rcond=None)
    if inv_b <= 0:
        return None
    return {"efficiency": float(min(1.5, 1.0 / inv_b / nominal)), "latency_s": float(max(0.0, alpha))}


def sharing_fit(net_ps: dict[str, Any]) -> dict[str, float]:
    """σ of the simulation's ``tcp`` link sharing, down (fan-out) and up (fan-in), from the microbenchmark."""
    from failslow.predict.des import fit_sharing_sigma

    down = {int(k): v["fanout_median_s"] for k, v in net_ps.items()}
    up = {int(k): v["fanin_median_s"] for k, v in net_ps.items()}
    return {"down_sigma": fit_sharing_sigma(down), "up_sigma": fit_sharing_sigma(up)}


def _model_bytes(job: dict[str, Any]) -> int:
    spec = job["spec"]
    w, d, c = spec["width"], spec["depth"], spec["classes"]
    return 4 * (d * (w * w + w) + w * c + c)


def combine(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One data document from per-architecture sweeps (each taken in its own quiet-lock hold).

    Every part keeps its own merged profile under ``profiles_by_arch``: each architecture is
    predicted from the single-worker profile taken in the same session as its runs.
    """
    if not docs:
        raise ValueError("nothing to combine")
    out: dict[str, Any] = {"format": "failslow-dp-measured/3", "spec": docs[0]["spec"],
                           "repeats": max(d["repeats"] for d in docs), "runs": [], "profiles_by_arch": {},
                           "net": {}, "parts": []}
    out["lite"] = []
    for d in docs:
        archs = sorted({r["arch"] for r in d["runs"]})
        off = len(out["lite"])
        out["lite"] += d.get("lite", [])
        for r in d["runs"]:
            if "local_profiles" in r:
                r = {**r, "local_profiles": [[j + off for j in idx] for idx in r["local_profiles"]]}
            out["runs"].append(r)
        for arch in archs:
            out["profiles_by_arch"][arch] = d["profile"]
        for kind, table in d.get("net", {}).items():
            out["net"].setdefault(kind, {}).update(table)
        out["parts"].append({"archs": archs, "profiles": d["profiles"], "started": d.get("started"),
                             "finished": d.get("finished"), **({"host": d["host"]} if "host" in d else {})})
    # The link-sharing σ is a property of the network (the same tbf links in every hold): a hold that
    # did not run the fan-out/fan-in microbenchmark borrows it from one that did.
    shared = next((d["profile"]["link"]["sharing"] for d in docs if "sharing" in d["profile"]["link"]), None)
    if shared is not None:
        for arch, prof in out["profiles_by_arch"].items():
            if "sharing" not in prof["link"]:
                out["profiles_by_arch"][arch] = {**prof, "link": {**prof["link"], "sharing": shared}}
    # The first part's profile stays the document's default (older readers use "profile").
    out["profile"] = docs[0]["profile"]
    return out


def job_detail(job: dict[str, Any]) -> dict[str, Any]:
    """The per-rank timings worth keeping (diagnostics for the docs), compactly."""
    out: dict[str, Any] = {}
    for rank, r in job["ranks"].items():
        if "phases_s" in r:
            out[rank] = {"phases_mean_s": [statistics.fmean(p[i] for p in r["phases_s"]) for i in range(3)]}
            if r.get("compute_cpu_s"):
                out[rank]["compute_cpu_median_s"] = statistics.median(r["compute_cpu_s"])
            if "step_end_s" in r:
                # Every step's phases and its end on the shared monotonic clock:
                # across the ranks of a step they give each member's entry into and exit from the
                # all-reduce, i.e. the barrier wait and the collective after the last entry, step by step.
                out[rank]["steps_s"] = [[round(e, 6), *(round(x, 6) for x in p)]
                                        for e, p in zip(r["step_end_s"], r["phases_s"], strict=True)]
    return out


def read_doc(path: Path) -> dict[str, Any]:
    """A sweep file: xz-compressed JSON when the name ends in `.xz`, plain JSON otherwise."""
    if path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
    else:
        doc = json.loads(path.read_text())
    return doc


def write_doc(path: Path, doc: dict[str, Any]) -> None:
    """Write a sweep file: xz-compressed compact JSON when the name ends in `.xz`, indented JSON otherwise."""
    if path.suffix == ".xz":
        path.write_bytes(lzma.compress(json.dumps(doc, separators=(",", ":")).encode(),
                                       preset=9 | lzma.PRESET_EXTREME))
    else:
        path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.dparch.measure", description=__doc__)
    ap.add_argument("--out", type=Path, help="output file (required unless --remerge); FILE.json.xz: compressed")
    ap.add_argument("--arch", default=",".join(ARCHS))
    ap.add_argument("--workers", default="1-8")
    ap.add_argument("--rate", default=RunSpec.rate)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-net", action="store_true", help="skip the network microbenchmarks")
    ap.add_argument("--local", action="store_true", help="also a short profile next to every run (diagnostic)")
    ap.add_argument("--remerge", type=Path, nargs="+", metavar="SWEEP",
                    help="instead of measuring, rebuild the merged profile of saved sweep files in place")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="PART",
                    help="instead of measuring, combine per-architecture sweep files into --out")
    args = ap.parse_args(argv)
    if args.remerge:
        for f in args.remerge:
            doc = read_doc(f)
            finish_profile(doc)
            write_doc(f, doc)
        return 0
    if args.out is None:
        ap.error("--out FILE is required")
    if args.combine:
        write_doc(args.out, combine([read_doc(f) for f in args.combine]))
        return 0
    lo, _, hi = args.workers.partition("-")
    workers = list(range(int(lo), int(hi or lo) + 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(d: dict[str, Any]) -> None:
        write_doc(args.out, d)

    sweep(RunSpec(arch="ring", workers=1, rate=args.rate), args.arch.split(","), workers, save=save,
          repeats=args.repeats, net=not args.no_net, local=args.local,
          log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
