"""FALCON's validation stage on the testbed: benchmarks the training processes run at an iteration boundary.

Two requests of the run directory's protocol (``validate_compute``, ``validate_links``) become one control
snapshot each, ``{"validate": {"id", "kind", "at", "dir", ...}}``. Every rank reads it at the start of
iteration ``at`` (as it reads micro-batch counts) and, before training that iteration, takes part in the
test (:func:`run_in_rank`):

* ``compute`` — a barrier on the default group, then the suspects and their peers time the same fixed GEMM
  (torch, on CUDA when there is a GPU, else on the rank's CPU, where a cgroup quota shows), the other ranks
  wait; a closing barrier. On CPU the benchmarks take turns (the testbed's ranks share the host's cores,
  and concurrent ones would slow each other down), with a GPU per rank they run at once;
* ``links`` — rounds of disjoint node pairs from :func:`failslow.plan.validate.link_schedule`; in each round
  (a barrier first) the node's first rank of every pair exchanges small messages (latency: the quickest
  round trip / 2) and tensors each way (bandwidth: the best rate of a 256 KiB probe, then of 4 MiB where
  the link is quick) with gloo send/recv over the real veth links, so a ``tc`` throttle shows;
  ranks not in a pair skip the round's p2p.

Each participant writes ``<dir>/rank<r>.json``. The launcher (:func:`validate_compute`, :func:`validate_links`)
waits for those files and for iteration ``at`` to end everywhere, applies the pure verdict, and answers with
the verdict, the numbers and the pause: iteration ``at``'s extra length over the recent iterations (the
job's iteration ends, slowest rank). Training then goes on with the same iteration count.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failslow.errors import InputError
from failslow.plan.validate import (
    COMPUTE_THRESHOLD,
    LINK_LATENCY_MULTIPLE,
    LinkMeasurement,
    LinkSchedule,
    LinkVerdict,
    compute_verdict,
    link_schedule,
    link_verdict,
    merge_schedules,
)

if TYPE_CHECKING:
    from testbed.launcher import Testbed

# GEMM benchmark: 384^3 products, ~1.2 ms each on one core here (~95 GFLOP/s, torch 1 thread), in three 0.1 s
# windows per rank, each after 0.04 s untimed (see Gemm): ~0.42 s per rank. Windows of a CFS period (0.1 s)
# measure a quota q as ~q; with two windows a neighbour on this shared host spoiled both about 1 run in 10.
# 4096^3 products on a GPU.
CPU_GEMM_SIZE, CPU_GEMM_WINDOWS, CPU_GEMM_WINDOW_S, CPU_GEMM_WARMUP_S = 384, 3, 0.1, 0.04
CUDA_GEMM_SIZE, CUDA_GEMM_REPS = 4096, 50
# Link test: a 256 KiB probe takes ~0.1 s through a 20 mbit tbf and well under 1 ms on a healthy veth,
# where per-message costs would dominate it: a probe faster than LINK_PROBE_QUICK_S is followed by 4 MiB
# transfers (~4 ms there). Each direction repeats the transfer until LINK_MIN_S has passed at the size it
# ends on (at least 2 transfers of that size, at most LINK_MAX_REPS in all) and keeps the best rate, so scheduling noise on the shared host does not make a
# healthy link look slow. Why longer than a CFS period (0.1 s): an end whose rank runs under a CPU quota (a
# compute fault) only runs a part of each period, and the best transfer must come from a part where it runs.
LINK_BYTES, LINK_LARGE_BYTES, LINK_PROBE_QUICK_S = 256 * 1024, 4 * 1024 * 1024, 0.01
LINK_PINGS, LINK_MAX_REPS, LINK_MIN_S = 10, 1000, 0.12
# Pings likewise go on for LINK_PING_MIN_S (at least LINK_PINGS, at most LINK_MAX_PINGS) and the quickest
# counts: ten pings in a row took 0.5-0.9 ms each twice in eight validations when one end ran under a CPU
# quota, against ~0.07 ms on the other links.
LINK_PING_MIN_S, LINK_MAX_PINGS = 0.12, 5000
# A link named slow by its latency alone is pinged again, at a later iteration boundary, for
# LINK_RECHECK_PING_S (pings only), and the quicker of the two counts: in one run of the test suite the
# quickest of 0.12 s of pings to a rank under a CPU quota was 0.8 ms (11x the other link; 59-112 us in eight
# validations of one job run alone).
LINK_RECHECK_PING_S = 0.5
RECENT_ITERS = 5  # iterations before the validation that its pause is measured against
#: A link is slow below this fraction of the reference here, not the core's 0.5: healthy veth links between
#: namespaces on the loaded 2-core host measured 1.0-3.3 GB/s in one validation (a 3x spread from CPU
#: scheduling alone), while a tc throttle leaves < 1% (20 mbit: 2.6 MB/s).
TESTBED_LINK_FRACTION = 0.25


# --- in the rank -----------------------------------------------------------------------------------------


def expected_pause_s(num_nodes: int) -> float:
    """What a validation is expected to pause the job for, from the benchmarks' own durations: a compute test
    of one suspect and its peer on CPU (the two take turns) or a link test of a ring over `num_nodes` nodes
    (pings, then a transfer each way, per round), whichever is longer. The barriers and the slower
    iteration around the test are left out, so a measured pause (docs/BENCHMARKS.md) is somewhat longer."""
    compute = 2 * CPU_GEMM_WINDOWS * (CPU_GEMM_WINDOW_S + CPU_GEMM_WARMUP_S)
    rounds = len(link_schedule(list(range(num_nodes))).rounds) if num_nodes >= 2 else 0
    return max(compute, rounds * (LINK_PING_MIN_S + 2 * LINK_MIN_S))


class Gemm:
    """The GEMM benchmark of one rank: products of two `size` x `size` float32 matrices (warmed up once).

    On CPU the rate is measured in wall-clock windows (:meth:`window`) and the best window counts. Why
    windows: the same pause whatever the rank's speed, and a fault that takes CPU away (a cgroup quota,
    handed out per 100 ms period) shows in every window of 0.1 s, while the best of several drops a window a
    neighbour on the shared host disturbed. On a GPU (`device_index`) :meth:`timed` runs a fixed number of
    products once.
    """

    def __init__(self, size: int, device_index: int | None = None) -> None:
        import torch

        self.torch, self.size, self.flops = torch, size, 2.0 * size**3
        self.dev = "cpu" if device_index is None else f"cuda:{device_index}"
        self.a, self.b = torch.randn(size, size, device=self.dev), torch.randn(size, size, device=self.dev)
        self.c = self.a @ self.b
        self.best, self.products, self.seconds = 0.0, 0, 0.0

    def window(self, window_s: float = CPU_GEMM_WINDOW_S, warmup_s: float = CPU_GEMM_WARMUP_S) -> None:
        """As many products as fit in `window_s` of wall time, after `warmup_s` untimed; keeps the best rate.

        Why the warm-up: a rank that waited (for its turn) has the rest of its CFS quota for the current
        period unspent, and would run a short window faster than its quota allows; the warm-up spends it.
        """
        end = time.perf_counter() + warmup_s
        while time.perf_counter() < end:
            self.torch.mm(self.a, self.b, out=self.c)
        k, t0 = 0, time.perf_counter()
        while (el := time.perf_counter() - t0) < window_s:
            self.torch.mm(self.a, self.b, out=self.c)
            k += 1
        self.best, self.products, self.seconds = max(self.best, k * self.flops / el), self.products + k, \
            self.seconds + el

    def timed(self, reps: int = CUDA_GEMM_REPS) -> None:
        """`reps` products timed once (synchronised: for a GPU)."""
        sync = self.torch.cuda.synchronize if self.dev != "cpu" else (lambda _d: None)
        sync(self.dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            self.torch.mm(self.a, self.b, out=self.c)
        sync(self.dev)
        el = time.perf_counter() - t0
        self.best, self.products, self.seconds = max(self.best, reps * self.flops / el), self.products + reps, \
            self.seconds + el

    def result(self) -> dict[str, Any]:
        """``{"gflops" (best), "gemm_s" (seconds per product at that rate), "seconds" (benchmark time),
        "device", "size", "products"}``."""
        return {"gflops": self.best / 1e9, "gemm_s": self.flops / self.best, "seconds": self.seconds,
                "device": self.dev, "size": self.size, "products": self.products}


def _links_in_rank(rank: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    probe = max(1, int(spec.get("bytes", LINK_BYTES)) // 4)  # float32 elements
    large = max(probe, int(spec.get("large_bytes", LINK_LARGE_BYTES)) // 4)
    big, small = torch.zeros(large), torch.zeros(1)
    out: list[dict[str, Any]] = []

    def one_way(src: int, dst: int) -> dict[str, Any] | None:
        # src times a send of n floats + a 1-float ack, repeated while the link is quick; before each, a
        # 1-float message with n (0: done). The probe size first; a link that moves it quickly gets the
        # large size, whose time fixed per-message costs (wake-ups, copies) no longer dominate.
        # The window (2 transfers, LINK_MIN_S) counts at the size the link ends on: a probe stalled by the
        # host must not use up the time of the large transfers that follow it.
        go, best, reps, n = torch.zeros(1), 0.0, 0, probe
        at_size, t_size = 0, time.monotonic()
        while True:
            if rank == src:
                more = at_size < 2 or (reps < int(spec.get("max_reps", LINK_MAX_REPS))
                                       and time.monotonic() - t_size < float(spec.get("min_s", LINK_MIN_S)))
                go.fill_(float(n) if more else 0.0)
                dist.send(go, dst)
                if not more:
                    return {"src": src, "dst": dst, "bytes": n * 4, "reps": reps, "bandwidth_Bps": best}
                t0 = time.perf_counter()
                dist.send(big[:n], dst)
                dist.recv(small, dst)
                el = time.perf_counter() - t0
                best = max(best, n * 4 / el)
                at_size += 1
                if el < LINK_PROBE_QUICK_S and n != large:
                    n, at_size, t_size = large, 0, time.monotonic()
            else:
                dist.recv(go, src)
                got = int(go.item())
                if got == 0:
                    return None
                dist.recv(big[:got], src)
                dist.send(small, src)
            reps += 1

    for k, pairs in enumerate(spec["rounds"]):
        dist.barrier()
        for a, b in pairs:
            if rank not in (a, b):
                continue
            rec: dict[str, Any] = {"round": k, "a": a, "b": b}
            rtts = []  # before the bulk transfers drain a tbf bucket; a's 1.0 asks for one more, 0.0 ends
            if rank == a:
                t_start = time.monotonic()
                while True:
                    more = len(rtts) < int(spec.get("pings", LINK_PINGS)) or (
                        len(rtts) < LINK_MAX_PINGS
                        and time.monotonic() - t_start < float(spec.get("ping_min_s", LINK_PING_MIN_S)))
                    small.fill_(1.0 if more else 0.0)
                    t0 = time.perf_counter()
                    dist.send(small, b)
                    if not more:
                        break
                    dist.recv(small, b)
                    rtts.append(time.perf_counter() - t0)
            else:
                while True:
                    dist.recv(small, a)
                    if small.item() == 0.0:
                        break
                    dist.send(small, a)
            if rtts:  # the quickest round trip: scheduling on the shared host only ever adds to it
                rec["latency_s"] = min(rtts) / 2
            for src, dst in (() if spec.get("latency_only") else ((a, b), (b, a))):
                got = one_way(src, dst)
                if got is not None:
                    rec["direction"] = got
            out.append(rec)
    return out


def run_in_rank(rank: int, spec: dict[str, Any]) -> float:
    """Take part in validation `spec` (every rank of the job calls this at the same iteration); returns seconds.

    Participants write ``<spec["dir"]>/rank<rank>.json``.
    """
    import torch.distributed as dist

    t0 = time.monotonic()
    dist.barrier()  # every rank has finished the previous iteration
    result: dict[str, Any] | None = None
    if spec["kind"] == "compute":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ranks = list(spec["ranks"])
        if gpus >= dist.get_world_size() and not spec.get("take_turns"):
            # a GPU per rank: the benchmarks run at once
            if rank in ranks:
                g = Gemm(int(spec.get("size") or CUDA_GEMM_SIZE), rank % gpus)
                g.timed(int(spec.get("reps") or CUDA_GEMM_REPS))
                result = {"rank": rank, **g.result()}
        else:
            # Ranks sharing the host's cores would measure each other: one rank at a time, a barrier between
            # turns; the windows go round the ranks, so one disturbance rarely spoils every window of a rank.
            mine = Gemm(int(spec.get("size") or CPU_GEMM_SIZE)) if rank in ranks else None
            for w in range(int(spec.get("windows") or CPU_GEMM_WINDOWS)):
                for i, r in enumerate(ranks):
                    if w or i:
                        dist.barrier()
                    if mine is not None and rank == r:
                        mine.window(float(spec.get("window_s") or CPU_GEMM_WINDOW_S))
            if mine is not None:
                result = {"rank": rank, **mine.result()}
    elif spec["kind"] == "links":
        links = _links_in_rank(rank, spec)
        if links:
            result = {"rank": rank, "links": links}
    dist.barrier()
    if result is not None:
        out = Path(spec["dir"]) / f"rank{rank}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out)
    return time.monotonic() - t0


# --- in the launcher -------------------------------------------------------------------------------------


def _ranks(tb: Testbed, ranks: Sequence[Any], what: str) -> list[int]:
    out = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < tb.world_size:
            raise InputError(f"{what}: {r!r} is not a rank of this job (0..{tb.world_size - 1})")
        if r not in out:
            out.append(r)
    return out


def default_peers(tb: Testbed, suspects: Sequence[int]) -> list[int]:
    """One healthy rank per suspect: the same pipeline stage in another DP replica where possible, on another node,
    each peer used once while unused ones remain.

    Raises:
        InputError: every rank is a suspect.
    """
    healthy = [r for r in range(tb.world_size) if r not in suspects]
    if not healthy:
        raise InputError("every rank is a suspect: no healthy peer to compare with")
    chosen: list[int] = []
    for s in suspects:
        cs = tb.layout.coords(s)

        def key(r: int, cs: Any = cs, s: int = s) -> tuple[int, int, int, int]:
            c = tb.layout.coords(r)
            return (r in chosen, c.pp != cs.pp, tb.placement[r] == tb.placement[s], r)

        best = min(healthy, key=key)
        if best not in chosen:
            chosen.append(best)
    return chosen


def _request_dir(tb: Testbed, vid: str) -> Path:
    d = tb.run_dir / "validate" / vid
    d.mkdir(parents=True, exist_ok=True)
    for f in d.glob("rank*.json"):  # a repeated id measures again
        f.unlink()
    return d


def _run(tb: Testbed, vid: str | None, spec: dict[str, Any], participants: set[int],
         timeout_s: float) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Schedule `spec` at a near-future iteration, wait for the participants' results and that iteration's end."""
    vid = vid or uuid.uuid4().hex[:12]
    out = _request_dir(tb, vid)
    at = tb._next_apply_at()
    if at > tb.config.iterations - 1:
        raise InputError(f"the job ends (iteration {tb.config.iterations}) before a validation can run at "
                         f"iteration {at}")
    tb._push({"validate": {**spec, "id": vid, "at": at, "dir": str(out)}}, apply_at=at)
    deadline = time.monotonic() + timeout_s
    from testbed.launcher import TestbedError

    while True:
        tb.poll()
        files = {r: out / f"rank{r}.json" for r in participants}
        done_at = all(recs and recs[-1]["it"] >= at for recs in tb.records.values())
        if done_at and all(f.exists() for f in files.values()):
            break
        if tb.finished():
            raise TestbedError(f"the job ended before validation {vid} at iteration {at} completed")
        if time.monotonic() > deadline:
            raise TestbedError(f"validation {vid} did not complete within {timeout_s:.0f} s")
        time.sleep(0.05)
    results = {r: json.loads(f.read_text()) for r, f in files.items()}
    return results, {"id": vid, "at_iteration": at, **_pause(tb, at)}


def _pause(tb: Testbed, at: int) -> dict[str, Any]:
    """How long iteration `at` held the job beyond its usual length (job iteration = between the slowest ends)."""
    ends: dict[int, float] = {}
    held = 0.0
    for recs in tb.records.values():
        for rec in recs:
            if at - RECENT_ITERS - 1 <= rec["it"] <= at:
                ends[rec["it"]] = max(ends.get(rec["it"], 0.0), rec["end_unix"])
                if rec["it"] == at:
                    held = max(held, float(rec.get("validate_s") or 0.0))
    dts = {it: ends[it] - ends[it - 1] for it in ends if it - 1 in ends}
    recent = [dts[it] for it in dts if it < at]
    if at not in dts or not recent:
        return {"pause_s": held, "iteration_s": None, "recent_iteration_s": None, "held_s": held}
    base = statistics.median(recent)
    return {"pause_s": max(0.0, dts[at] - base), "iteration_s": dts[at], "recent_iteration_s": base,
            "held_s": held}


def validate_compute(tb: Testbed, ranks: Sequence[int], peers: Sequence[int] | None = None, *,
                     vid: str | None = None, threshold: float = COMPUTE_THRESHOLD, size: int | None = None,
                     reps: int | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the GEMM benchmark on the suspect `ranks` and their `peers` at a near-future iteration boundary.

    The verdict compares GFLOP/s (:class:`Gemm`): slow below `threshold` of the peers' median.

    Returns:
        ``{"id", "at_iteration", "pause_s", "held_s", "iteration_s", "recent_iteration_s", "verdict",
        "confirmed", "cleared", "peers", "ranks": {rank: {"gflops", "gemm_s", "seconds", "device", "products",
        "suspect"}}}``.

    Raises:
        InputError: no suspect, a rank outside the job, a peer that is a suspect, no healthy peer.
    """
    sus = _ranks(tb, list(ranks), "validate_compute ranks")
    if not sus:
        raise InputError("validate_compute needs at least one suspect rank")
    prs = default_peers(tb, sus) if peers is None else _ranks(tb, list(peers), "validate_compute peers")
    if set(prs) & set(sus):
        raise InputError(f"peers {sorted(set(prs) & set(sus))} are also suspects")
    if not prs:
        raise InputError("validate_compute needs at least one peer")
    spec: dict[str, Any] = {"kind": "compute", "ranks": sus + prs}
    if size is not None:
        spec["size"] = int(size)
    if reps is not None:
        spec["reps"] = int(reps)
    res, meta = _run(tb, vid, spec, set(sus + prs), timeout_s)
    verdict = compute_verdict({r: res[r]["gflops"] for r in sus}, {r: res[r]["gflops"] for r in prs},
                              metric="gflops", threshold=threshold)
    per_rank = {str(r): {k: res[r][k] for k in ("gflops", "gemm_s", "seconds", "device", "products")}
                | {"suspect": r in sus} for r in sus + prs}
    return {**meta, "kind": "compute", "verdict": verdict.to_json(), "confirmed": list(verdict.confirmed),
            "cleared": list(verdict.cleared), "peers": prs, "ranks": per_rank}


def node_rings(tb: Testbed, groups: Sequence[Sequence[int]]) -> list[list[int]]:
    rings: list[list[int]] = []
    for g in groups:
        nodes: list[int] = []
        for r in g:
            n = tb.placement[r]
            if n not in nodes:
                nodes.append(n)
        if len(nodes) >= 2 and nodes not in rings:
            rings.append(nodes)
    return rings


def merge_rounds(schedules: list[LinkSchedule]) -> list[list[tuple[int, int]]]:
    """Disjoint schedules side by side; overlapping ones after each other."""
    batches: list[list[LinkSchedule]] = []
    for s in schedules:
        for batch in batches:
            if not any(set(s.nodes) & set(o.nodes) for o in batch):
                batch.append(s)
                break
        else:
            batches.append([s])
    return [list(r) for batch in batches for r in merge_schedules(batch)]


def _merge_links(res: dict[int, dict[str, Any]], node_of: dict[int, int], measured: dict[tuple[int, int], dict[str, Any]],
                 *, keep_quicker: bool = False) -> None:
    """The ranks' link records (`res`, by rank) into per-link measurements keyed by (node a, node b)."""
    for doc in res.values():
        for rec in doc["links"]:
            key = (node_of[rec["a"]], node_of[rec["b"]])
            m = measured.setdefault(key, {"a": key[0], "b": key[1]})
            if "latency_s" in rec:
                m["latency_s"] = min(m["latency_s"], rec["latency_s"]) if keep_quicker else rec["latency_s"]
            d = rec.get("direction")
            if d is not None:
                way = "a_to_b" if node_of[d["src"]] == key[0] else "b_to_a"
                m[f"{way}_Bps"], m[f"{way}_bytes"], m[f"{way}_reps"] = d["bandwidth_Bps"], d["bytes"], d["reps"]


def validate_links(tb: Testbed, nodes: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
                   suspects: Sequence[int] | None = None, topology: str = "ring", *, vid: str | None = None,
                   bandwidth_fraction: float = TESTBED_LINK_FRACTION,
                   latency_multiple: float = LINK_LATENCY_MULTIPLE, nbytes: int = LINK_BYTES,
                   timeout_s: float = 120.0) -> dict[str, Any]:
    """Measure the links of a communicator pairwise in O(1) rounds at a near-future iteration boundary.

    The communicator is `nodes` (in ring order), or the nodes of `ranks` (by the current placement, in rank
    order), or by default every DP group's ring of nodes (disjoint rings run in the same rounds). `suspects`
    are nodes under suspicion: the links not touching them are the reference (default: every link is).

    Returns:
        ``{"id", "at_iteration", "pause_s", "held_s", "iteration_s", "recent_iteration_s", "verdict", "nodes"
        (named slow), "slow_links", "rounds", "links": [{"a", "b", "bandwidth_Bps", "latency_s", "a_to_b_Bps",
        "b_to_a_Bps", and per direction the transfer size and count it ended on: "a_to_b_bytes", "a_to_b_reps",
        "b_to_a_bytes", "b_to_a_reps"}]}``, and ``"rechecked"`` when links slow by latency alone were pinged
        again (``LINK_RECHECK_PING_S``; each with both latencies, the iteration and the pause, which ``pause_s``
        and ``held_s`` include).

    Raises:
        InputError: fewer than 2 nodes, a node with no rank on it, an unknown topology, a bad rank.
    """
    if topology not in ("ring", "tree"):
        raise InputError(f"unknown topology {topology!r} (ring or tree)")
    if nodes is not None and ranks is not None:
        raise InputError("validate_links takes nodes or ranks, not both")
    if nodes is not None:
        comm = [int(n) for n in nodes]
        rings = [comm]
    elif ranks is not None:
        rings = node_rings(tb, [_ranks(tb, list(ranks), "validate_links ranks")])
    else:
        rings = node_rings(tb, tb.layout.groups("dp"))
    if not rings or any(len(r) < 2 for r in rings):
        raise InputError("validate_links needs a communicator spanning at least 2 nodes")
    first_rank: dict[int, int] = {}
    for r, n in enumerate(tb.placement):
        first_rank.setdefault(n, r)
    for ring in rings:
        empty = [n for n in ring if n not in first_rank]
        if empty:
            raise InputError(f"nodes {empty} hold no rank of this job (0..{tb.num_nodes - 1} with ranks: "
                             f"{sorted(first_rank)})")
    schedules = [link_schedule(ring, "ring" if topology == "ring" else "tree") for ring in rings]
    node_rounds = merge_rounds(schedules)
    rank_rounds = [[[first_rank[a], first_rank[b]] for a, b in rnd] for rnd in node_rounds]
    participants = {r for rnd in rank_rounds for pair in rnd for r in pair}
    spec = {"kind": "links", "rounds": rank_rounds, "bytes": int(nbytes)}
    res, meta = _run(tb, vid, spec, participants, timeout_s)
    node_of = {r: n for n, r in first_rank.items()}
    measured: dict[tuple[int, int], dict[str, Any]] = {}
    _merge_links(res, node_of, measured)
    links = [measured[e] for rnd in node_rounds for e in rnd]
    for m in links:
        m["bandwidth_Bps"] = min(m["a_to_b_Bps"], m["b_to_a_Bps"])

    def judge() -> LinkVerdict:
        return link_verdict([LinkMeasurement(m["a"], m["b"], m["bandwidth_Bps"], m["latency_s"]) for m in links],
                            suspect_nodes=list(suspects or []), bandwidth_fraction=bandwidth_fraction,
                            latency_multiple=latency_multiple)

    verdict = judge()
    recheck = {(e.a, e.b) for e in verdict.links if e.slow and e.why == "latency"}
    if recheck:
        # Slow by latency alone: pinged again at a later boundary for longer, the quicker measurement counts.
        again = [[[first_rank[a], first_rank[b]] for a, b in rnd if (a, b) in recheck] for rnd in node_rounds]
        again = [rnd for rnd in again if rnd]
        res2, meta2 = _run(tb, None if vid is None else f"{vid}-latency",
                           {"kind": "links", "rounds": again, "latency_only": True, "ping_min_s": LINK_RECHECK_PING_S},
                           {r for rnd in again for pair in rnd for r in pair}, timeout_s)
        first_latency = {e: measured[e]["latency_s"] for e in recheck}
        _merge_links(res2, node_of, measured, keep_quicker=True)
        verdict = judge()
        meta = {**meta, "pause_s": meta["pause_s"] + meta2["pause_s"], "held_s": meta["held_s"] + meta2["held_s"],
                "rechecked": [{"a": a, "b": b, "at_iteration": meta2["at_iteration"], "pause_s": meta2["pause_s"],
                               "latency_s": [first_latency[(a, b)], measured[(a, b)]["latency_s"]]}
                              for a, b in sorted(recheck)]}
    return {**meta, "kind": "links", "verdict": verdict.to_json(), "nodes": list(verdict.nodes),
            "ambiguous": list(verdict.ambiguous), "slow_links": [list(e) for e in verdict.slow_links],
            "rounds": [[list(e) for e in rnd] for rnd in node_rounds], "links": links}
