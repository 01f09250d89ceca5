"""Orchestrates data-parallel scaling runs: namespaces, shaped links, CPU caps, processes, results.

Every process (worker, server, profiler peer) runs in its own network namespace from `testbed.netns`
(a veth into a bridge namespace), with `tc tbf` at the same rate on both ends of its link, and in its
own cgroup v1 cpu group from `testbed.cgroup` capped at the same quota. Processes start uncapped
(torch import and gloo rendezvous would take a minute at 0.15 CPU), report ready through a file,
are moved into their cgroups, then get a ``go`` file and train. Everything created is torn down in
``finally`` (and recorded in the testbed state file for `failslow testbed cleanup` if we are killed).

Why the caps: this machine has 2 cores shared with other jobs; K workers plus a server at full speed
would contend for them and compute time would grow with K for reasons that have nothing to do with
the architecture. Capping every process at ``cpu_total / (max_workers + 1)`` (default 1.4 / 9 ≈ 0.156
CPU) keeps the sum of all caps of the largest run below the 2 cores, with headroom for the kernel's
network work and neighbours, and — being the same for every K — makes the single-worker profile
valid for every K. A 10 ms CFS period (instead of 100 ms) makes the throttling fine-grained, so
short per-layer operations are not stretched by whole-period stalls.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.cgroup import CpuCgroup
from testbed.netns import NODE_IFNAME, NetCluster, parse_rate, run_cmd

FORMAT = "failslow-dp-profile/1"
ARCHS = ("ring", "ps-sync", "ps-async")
# Jobs that are not training runs: the single-worker profile and the network microbenchmarks.
BENCHES = ("profile", "profile-lite", "net-ring", "net-ps")
REPO = Path(__file__).resolve().parents[2]


class RunError(RuntimeError):
    """A scaling run could not start or a process failed (message carries its output)."""


@dataclass(frozen=True)
class RunSpec:
    """One run: architecture, worker count, link rate, CPU cap, model and lengths."""

    arch: str  # ring | ps-sync | ps-async | profile
    workers: int
    rate: str = "200mbit"
    cpu_cap: float = 1.4 / 9
    cpu_period_us: int = 10_000
    cpu_shares: int = 8192
    burst_bytes: int = 32_000
    steps: int = 20
    warmup: int = 4
    width: int = 256
    depth: int = 5
    classes: int = 10
    batch_size: int = 512
    lr: float = 0.001
    seed: int = 0
    calib_rounds: int = 12
    timeout_s: float = 300.0
    pin_cpus: bool = True

    def ranks(self) -> int:
        """Processes in the run (a server for the parameter-server architectures, a peer for profiling)."""
        if self.arch in ("ring", "net-ring"):
            return self.workers
        return self.workers + 1 if self.arch in ("ps-sync", "ps-async", "net-ps") else 2


def rate_bytes_per_s(rate: str) -> float:
    """A tc rate (``200mbit``) in bytes per second."""
    return parse_rate(rate) / 8


def shape(netns: str, ifname: str, rate: str, burst_bytes: int) -> None:
    """`tc tbf` on one end of a node's link with a small bucket.

    Unlike the fault injector's 10 ms bucket, ~1 ms of traffic: a bucket that refills during every
    compute phase would send each message shorter than it at line rate, so transfer time would stop
    being size/rate — the very thing the models (and the paper's) assume about a link.
    """
    run_cmd(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", ifname, "root", "tbf",
             "rate", f"{int(parse_rate(rate))}bit", "burst", str(burst_bytes), "latency", "100ms"])


def run_job(spec: RunSpec, *, python: str | None = None) -> dict[str, Any]:
    """Run one job for real; see `run_pool`."""
    return run_pool([spec], python=python)[0]


def run_pool(specs: list[RunSpec], *, python: str | None = None) -> list[dict[str, Any]]:
    """Run several jobs one after another on one set of processes; one result per spec.

    The processes (as many as the largest job needs, one namespace each) start once; each job is a
    gloo subgroup of the first ``spec.ranks()`` of them (the server, for a parameter server, is
    rank 0), the others wait at a barrier. Starting 9 torch processes takes minutes on a busy 2-core
    box, so a sweep pays it once instead of 24 times. Link rate, CPU cap and model come from the first
    spec and must be the same in all.

    Returns:
        per spec ``{"spec": {...}, "ranks": {"<rank in job>": {...}}}``.

    Raises:
        RunError: bad specs, a process died or timed out, or a namespace/cgroup could not be set up.
    """
    if not specs:
        raise RunError("nothing to run")
    first = specs[0]
    for spec in specs:
        if spec.arch not in (*ARCHS, *BENCHES):
            raise RunError(f"unknown architecture {spec.arch!r}")
        if spec.workers < 1:
            raise RunError("need at least one worker")
        same = ("rate", "cpu_cap", "cpu_period_us", "cpu_shares", "burst_bytes", "width", "depth", "classes",
                "batch_size", "lr", "seed", "calib_rounds", "pin_cpus")
        if any(getattr(spec, k) != getattr(first, k) for k in same):
            raise RunError("jobs of one pool must share rate, CPU cap and model")
    n = max(spec.ranks() for spec in specs)
    schedule = [{"arch": s.arch, "members": list(range(s.ranks())), "steps": s.steps, "warmup": s.warmup}
                for s in specs]
    py = python or sys.executable
    run_dir = Path(tempfile.mkdtemp(prefix="fsl-dparch-"))
    procs: list[subprocess.Popen[bytes]] = []
    cgroups: list[CpuCgroup] = []
    logs = []
    net = NetCluster.create(num_nodes=n)
    try:
        for node in range(n):
            for netns, ifname in net.link_devices(node):
                shape(netns, ifname, first.rate, first.burst_bytes)
        init = f"tcp://{net.address(0)}:29517"
        for rank in range(n):
            cfg = {**asdict(first), "rank": rank, "world_size": n, "init_method": init, "run_dir": str(run_dir),
                   "schedule": schedule}
            log = open(run_dir / f"log-{rank}.txt", "wb")  # noqa: SIM115 - closed in finally
            logs.append(log)
            procs.append(subprocess.Popen([*net.exec_prefix(rank), py, "-m", "testbed.dparch.train", json.dumps(cfg)],
                                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                          env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": NODE_IFNAME}))
        deadline = time.monotonic() + first.timeout_s
        ready: dict[int, int] = {}
        while len(ready) < n:
            for rank in range(n):
                f = run_dir / f"ready-{rank}"
                if rank not in ready and f.exists() and f.read_text().strip():
                    ready[rank] = int(f.read_text())
            _check_alive(procs, run_dir)
            if time.monotonic() > deadline:
                raise RunError(f"ranks not ready after {first.timeout_s}s: {sorted(set(range(n)) - set(ready))}")
            time.sleep(0.05)
        for rank, pid in sorted(ready.items()):
            cg = CpuCgroup.create(f"dp{rank}", prefix=net.prefix)
            cgroups.append(cg)
            cg.set_quota(first.cpu_cap, period_us=first.cpu_period_us)
            # A high weight so that on a busy shared machine each process still gets its full quota
            # (the quota, not the weight, is what bounds us: the sum of caps stays below the 2 cores).
            (cg.path / "cpu.shares").write_text(str(first.cpu_shares))
            cg.add(pid)
            if first.pin_cpus:
                pin(pid, rank)
        (run_dir / "go").write_text("go")
        deadline = time.monotonic() + sum(s.timeout_s for s in specs)
        for p in procs:
            left = deadline - time.monotonic()
            try:
                p.wait(timeout=max(1.0, left))
            except subprocess.TimeoutExpired as exc:
                raise RunError(f"runs timed out\n{_tail_logs(run_dir)}") from exc
        _check_alive(procs, run_dir)
        per_rank = []
        for rank in range(n):
            f = run_dir / f"result-{rank}.json"
            if not f.exists():
                raise RunError(f"rank {rank} wrote no result\n{_tail_logs(run_dir)}")
            per_rank.append(json.loads(f.read_text())["results"])
        return [{"spec": asdict(spec), "ranks": {str(r): per_rank[r][i] for r in range(spec.ranks())}}
                for i, spec in enumerate(specs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
        for cg in cgroups:
            cg.destroy()
        net.destroy()
        shutil.rmtree(run_dir, ignore_errors=True)


def pin(pid: int, rank: int) -> None:
    """Bind every thread of a process to one CPU, rank by rank round-robin.

    Why: CFS bandwidth control charges runtime per CPU run queue and only checks it at the 4 ms tick
    (HZ=250), so a capped task overruns its 1.6 ms quota and the debt stays on the CPU where it was
    made; a task that migrates leaves it behind and gets more than its cap, by an amount that depends
    on how often neighbours push it around. Measured on this box (`docs/predict.md`): unpinned, the
    CPU share of one capped worker drifted between 0.163 and 0.173 of a CPU from run to run (cap
    0.156); pinned, 0.158-0.164. Threads created later (gloo's per-group I/O threads) inherit it.
    """
    cpus = sorted(os.sched_getaffinity(0))
    target = {cpus[rank % len(cpus)]}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError as exc:
        raise RunError(f"cannot list threads of {pid}: {exc}") from exc
    for tid in tids:
        try:
            os.sched_setaffinity(tid, target)
        except OSError as exc:
            raise RunError(f"cannot pin thread {tid} of {pid} to CPU {target}: {exc}") from exc


def _tail_logs(run_dir: Path) -> str:
    out = []
    for f in sorted(run_dir.glob("log-*.txt")):
        text = f.read_text(errors="replace").strip().splitlines()[-15:]
        out.append(f"--- {f.name}\n" + "\n".join(text))
    return "\n".join(out)


def _check_alive(procs: list[subprocess.Popen[bytes]], run_dir: Path) -> None:
    for rank, p in enumerate(procs):
        rc = p.poll()
        if rc not in (None, 0):
            raise RunError(f"rank {rank} exited with {rc}\n{_tail_logs(run_dir)}")


def throughput(job: dict[str, Any]) -> float:
    """Measured samples per second of a finished ring / ps-sync / ps-async run."""
    spec = job["spec"]
    k, b, warm = spec["workers"], spec["batch_size"], spec["warmup"]
    arch = spec["arch"]
    if arch in ("ring", "ps-sync"):
        ends = job["ranks"]["0"]["step_end_s"]
        if warm < 1 or len(ends) <= warm:
            raise RunError("need warm-up steps and at least one measured step")
        return float(k * b * (len(ends) - warm) / (ends[-1] - ends[warm - 1]))
    if arch == "ps-async":
        ups = job["ranks"]["0"]["updates"]
        per: dict[int, list[float]] = {}
        for src, t in ups:
            per.setdefault(int(src), []).append(float(t))
        # Same window as the simulation: every worker past its warm-up, none finished yet.
        t0 = max(v[warm - 1] for v in per.values())
        t1 = min(v[-1] for v in per.values())
        count = sum(1 for _, t in ups if t0 < t <= t1)
        if t1 <= t0 or count == 0:
            raise RunError("async run too short to measure")
        return float(count * b / (t1 - t0))
    raise RunError(f"no throughput for {arch!r}")


def _line(pts: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept of (bytes, seconds) points."""
    xs = [s for s, _ in pts]
    ys = [t for _, t in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def fit_allreduce(calibration: dict[str, list[float]], nominal: float) -> dict[str, Any]:
    """Fit one ring hop from all-reduces between two ranks: t(s) = s/B_ring + 2α_ring (K = 2)."""
    pts = sorted((int(s), statistics.median(v)) for s, v in calibration.items())
    slope, intercept = _line(pts)
    eff = min(1.5, 1.0 / slope / nominal) if slope > 0 else 1.0
    return {"efficiency": eff, "latency_s": max(0.0, intercept / 2), "points": [[s, t] for s, t in pts]}


def fit_link(calibration: dict[str, list[float]], nominal: float) -> dict[str, Any]:
    """Fit t(s) = α + s/B_eff to reply sizes (bytes) → round-trip times, least squares on medians.

    The 4-byte round trip is the request leg plus a tiny reply, so half of it is subtracted from α.
    """
    pts = sorted((int(s), statistics.median(v)) for s, v in calibration.items())
    tiny = pts[0][1]
    slope, intercept = _line([(s, t) for s, t in pts if s > 4])
    eff = min(1.5, 1.0 / slope / nominal) if slope > 0 else 1.0
    return {"bandwidth_bytes_per_s": nominal, "efficiency": eff, "latency_s": max(0.0, intercept - tiny / 2),
            "rtt_tiny_s": tiny, "points": [[s, t] for s, t in pts]}


def lite_steps(job: dict[str, Any]) -> dict[str, Any]:
    """The step samples of a ``profile-lite`` run (no link calibration): per-step, per-layer times."""
    r = job["ranks"]["0"]
    upd = statistics.median(r["update_s"])
    fwd, bwd = whole_steps(r["forward_s"], r["backward_s"], r.get("step_wall_s"), upd)
    ifwd, ibwd = whole_steps(r["idle_forward_s"], r["idle_backward_s"], r.get("idle_step_wall_s"), upd)
    return {"forward_s": fwd, "backward_s": bwd, "idle_forward_s": ifwd,
            "idle_backward_s": ibwd, "update_s": upd,
            "compute_cpu_s": statistics.median(r["compute_cpu_s"])}


def local_profile(base: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A profile from `base` (layers, link fits) with its compute replaced by the given lite samples.

    Used to predict a run from the single-worker profiling taken right before and after it, so the
    machine's state at the time (neighbours' load changes the CPU work of a step by up to ~70 % on
    this shared box, see docs/predict.md) is the same in profile and run.
    """
    out = json.loads(json.dumps(base))
    keys = ("forward_s", "backward_s", "idle_forward_s", "idle_backward_s")
    out["steps"] = {k: [row for s in steps for row in s[k]] for k in keys}
    for i, layer in enumerate(out["layers"]):
        layer["forward_s"] = statistics.median(row[i] for row in out["steps"]["forward_s"])
        layer["backward_s"] = statistics.median(row[i] for row in out["steps"]["backward_s"])
    out["update_s"] = statistics.median(s["update_s"] for s in steps)
    out["meta"] = {**out.get("meta", {}), "local": len(steps)}
    return out


def whole_steps(fwd: list[list[float]], bwd: list[list[float]], walls: list[float] | None,
                minus: float = 0.0) -> tuple[list[list[float]], list[list[float]]]:
    """Per-layer step samples scaled so that each step adds up to its measured wall time.

    Under the CPU quota a throttle stall (8 ms of a 10 ms period) lands wherever the tick finds the
    process: inside a timed layer, but also between layers, in the gradient flattening or the update,
    whose *median* time (`update_s`) leaves stalls out. The per-layer sums missed 14 ms of an 87 ms
    step that way (whole-step wall time of the same loop, testbed). Scaling each step's layers by
    ``(wall − minus) / sum`` keeps their proportions and puts every stall of the step into it, so
    that samples + ``minus`` (the update, added by the models) is the step as it really ran.
    Without wall times (older runs) the samples unchanged.
    """
    if not walls:
        return fwd, bwd
    if len(walls) != len(fwd):
        raise RunError("profile: step wall times and per-layer samples differ in length")
    out_f: list[list[float]] = []
    out_b: list[list[float]] = []
    for fr, br, w in zip(fwd, bwd, walls, strict=True):
        total = sum(fr) + sum(br)
        c = (w - minus) / total if total > 0 and w - minus > 0 else 1.0
        out_f.append([x * c for x in fr])
        out_b.append([x * c for x in br])
    return out_f, out_b


def profile_doc(job: dict[str, Any]) -> dict[str, Any]:
    """The single-worker profile (format failslow-dp-profile/1) from a finished ``profile`` run."""
    spec = job["spec"]
    r = job["ranks"]["0"]
    upd = statistics.median(r["update_s"])
    raw_total = statistics.fmean(sum(a) + sum(b) for a, b in zip(r["forward_s"], r["backward_s"], strict=True))
    fwd, bwd = whole_steps(r["forward_s"], r["backward_s"], r.get("step_wall_s"), upd)
    steps: dict[str, Any] = {"forward_s": fwd, "backward_s": bwd}
    if r.get("idle_forward_s"):
        steps["idle_forward_s"], steps["idle_backward_s"] = whole_steps(
            r["idle_forward_s"], r["idle_backward_s"], r.get("idle_step_wall_s"), upd)
    if r.get("net_forward_s"):
        # A worker's compute phase after a transfer (load, compute, flatten); the PS models add
        # `update_s` to a worker's compute for the packing/unpacking, so it comes off here too.
        steps["net_forward_s"], steps["net_backward_s"] = whole_steps(
            r["net_forward_s"], r["net_backward_s"], r.get("net_step_wall_s"), upd)
    if r.get("ring_forward_s"):
        # A ring worker's step after an all-reduce (compute + update, the collective left out).
        steps["ring_forward_s"], steps["ring_backward_s"] = whole_steps(
            r["ring_forward_s"], r["ring_backward_s"], r.get("ring_step_wall_s"), upd)
        peer = job["ranks"].get("1", {}).get("ring_peer_step_wall_s")
        if peer and r.get("ring_step_wall_s") and len(peer) == len(r["ring_step_wall_s"]):
            # The other ring member's steps, paired step by step with these (the collective
            # synchronises them): less the update, as the samples above.
            steps["ring_peer_step_s"] = [w - upd for w in peer]
    n = len(r["param_bytes"])
    # Per-layer medians: a step caught by a neighbour's burst (or a whole-period throttle stall landing
    # in one layer) must not move the profile; the step samples keep the spread for the simulation.
    layers = [{"name": f"{i}:{r['names'][i]}", "param_bytes": r["param_bytes"][i],
               "forward_s": statistics.median(s[i] for s in fwd), "backward_s": statistics.median(s[i] for s in bwd)}
              for i in range(n)]
    link = fit_link(r["calibration"], rate_bytes_per_s(spec["rate"]))
    ring = fit_allreduce(r["allreduce_calibration"], rate_bytes_per_s(spec["rate"]))
    return {
        "format": FORMAT,
        "batch_size": spec["batch_size"],
        "layers": layers,
        "steps": steps,
        "update_s": upd,
        "accumulate_s": statistics.median(r["accumulate_s"]),
        "link": {**{k: link[k] for k in ("bandwidth_bytes_per_s", "efficiency", "latency_s")},
                 "allreduce": {"efficiency": ring["efficiency"], "latency_s": ring["latency_s"]}},
        "overlap": False,
        "meta": {"source": "failslow testbed dp-scaling --profile", "rate": spec["rate"],
                 "cpu_cap": spec["cpu_cap"], "cpu_period_us": spec["cpu_period_us"],
                 "model": {"width": spec["width"], "depth": spec["depth"], "classes": spec["classes"]},
                 "calibration": link, "allreduce_calibration": ring,
                 "step_total_s": statistics.fmean(sum(a) + sum(b) for a, b in zip(fwd, bwd, strict=True)),
                 "step_layer_sum_s": raw_total,
                 "compute_cpu_s": statistics.median(r["compute_cpu_s"]) if r.get("compute_cpu_s") else None},
    }
