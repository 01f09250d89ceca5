"""FALCON's validation stage, pure: which link tests to run in which round, and what the measurements say.

What it is for: a detector names suspects (a slow rank, a slow node's links) from iteration and
communication timings, which a busy neighbour or a data skew can mimic. Before an expensive action
(re-placing the topology, restarting without a node) a short direct test confirms them:

* **Compute.** Every suspect and a few healthy peers of the same job run the same fixed GEMM benchmark at an
  iteration boundary. A rank is slow when its throughput is below ``threshold`` (default
  :data:`COMPUTE_THRESHOLD` = 0.8) of the healthy peers' median throughput. Benchmark *times* (seconds for the
  fixed work) and *rates* (GFLOP/s) are both accepted; times are turned into throughput as 1/seconds.
* **Links.** The nodes of the suspect communicator test their links pairwise with point-to-point transfers. A
  ring over n nodes has n links (one for n = 2); testing them one at a time would take n rounds. FALCON's
  O(1)-round schedule runs disjoint pairs at the same time: :func:`ring_schedule` measures every ring link in
  two rounds of disjoint pairs when n is even (links starting at even positions, then at odd positions) and
  three when n is odd (the wrap-around link closes an odd cycle and gets a round of its own). For tree
  collectives :func:`tree_schedule` colours the tree's edges properly with as many colours as the tree's
  largest degree Δ (trees are bipartite, so Δ colours suffice — König's edge-colouring theorem; the greedy
  colouring from the root below reaches it), one round per colour: 3 rounds for the binary trees
  (:func:`binary_tree_edges`) NCCL's tree algorithm uses, whatever their size. A link is slow when its
  bandwidth is below ``bandwidth_fraction`` (default :data:`LINK_BANDWIDTH_FRACTION` = 0.5) of the median
  over the links not under suspicion (over the faster half of all links when fewer than three are clean), or its small-message latency above
  ``latency_multiple`` (default :data:`LINK_LATENCY_MULTIPLE` = 5) times their median latency. A node is
  named when every link it was measured on is slow (see :func:`link_verdict` for nodes measured on one link
  only).

Both verdicts keep their evidence (ratio to the reference, the threshold) and serialise with ``to_json()``.
The link schedules are defined in :mod:`failslow.plan.validate_schedule` and importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from failslow.errors import InputError
from failslow.plan.validate_schedule import (
    Edge,
    Kind,
    LinkSchedule,
    binary_tree_edges,
    link_schedule,
    merge_schedules,
    ring_edges,
    ring_schedule,
    tree_schedule,
)

__all__: list[str] = [
    "COMPUTE_THRESHOLD", "LINK_BANDWIDTH_FRACTION", "LINK_LATENCY_MULTIPLE", "MIN_CLEAN_LINKS", "ComputeVerdict",
    "Edge", "Kind", "LinkEvidence", "LinkMeasurement", "LinkSchedule", "LinkVerdict", "RankEvidence",
    "binary_tree_edges", "compute_verdict", "link_schedule", "link_verdict", "merge_schedules", "ring_edges",
    "ring_schedule", "tree_schedule"]

#: A rank is slow below this fraction of its healthy peers' median benchmark throughput. FALCON flags a GPU
#: whose GEMM rate falls clearly below its peers'; 0.8 leaves room for the ±10 % run-to-run spread of a
#: short benchmark on shared hosts while a 0.3-CPU quota (rate ≈ 0.3) or a throttled GPU is far below it.
COMPUTE_THRESHOLD: Final = 0.8
#: A link is slow below this fraction of the clean links' median bandwidth.
LINK_BANDWIDTH_FRACTION: Final = 0.5
#: A link is slow above this multiple of the clean links' median small-message latency. Latencies of
#: healthy links vary more than bandwidths (scheduling noise dominates a ~0.1 ms round trip), hence the
#: wide margin.
LINK_LATENCY_MULTIPLE: Final = 5.0
#: Links not under suspicion needed for them alone to be the reference (else: the faster half of all links).
MIN_CLEAN_LINKS: Final = 3


# --- compute ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankEvidence:
    """One rank's benchmark against the healthy peers.

    Attributes:
        rank: The rank.
        suspect: Whether it was under suspicion (else a healthy peer).
        value: The measurement as given (seconds or GFLOP/s).
        ratio: Its throughput over the peers' median throughput (1.0 = as fast as the peers).
        slow: ``ratio < threshold``.
    """

    rank: int
    suspect: bool
    value: float
    ratio: float
    slow: bool

    def to_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"rank": self.rank, "suspect": self.suspect, "value": self.value, "ratio": self.ratio,
                "slow": self.slow}


@dataclass(frozen=True)
class ComputeVerdict:
    """The compute validation's outcome with its evidence.

    Attributes:
        metric: ``"seconds"`` (time of the fixed work) or ``"gflops"`` (rate).
        threshold: The fraction of the peers' median throughput below which a rank is slow.
        reference: The peers' median, in the metric's unit.
        ranks: Evidence per rank, suspects first, each group by rank.
    """

    metric: str
    threshold: float
    reference: float
    ranks: tuple[RankEvidence, ...]

    @property
    def confirmed(self) -> tuple[int, ...]:
        """Suspects the benchmark found slow."""
        return tuple(e.rank for e in self.ranks if e.suspect and e.slow)

    @property
    def cleared(self) -> tuple[int, ...]:
        """Suspects the benchmark found as fast as their peers."""
        return tuple(e.rank for e in self.ranks if e.suspect and not e.slow)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (with ``confirmed`` and ``cleared``)."""
        return {"kind": "compute", "metric": self.metric, "threshold": self.threshold, "reference": self.reference,
                "confirmed": list(self.confirmed), "cleared": list(self.cleared),
                "ranks": [e.to_json() for e in self.ranks]}


def _positive(values: Mapping[int, float], what: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in values.items():
        x = float(v)
        if not math.isfinite(x) or x <= 0:
            raise InputError(f"{what} of {k}: need a finite positive number, got {v!r}")
        out[int(k)] = x
    return out


def _fraction(x: float, what: str, high: float = 1.0) -> float:
    if not (isinstance(x, int | float) and math.isfinite(x) and 0 < x <= high):
        raise InputError(f"{what} must be in (0, {high:g}], got {x!r}")
    return float(x)


def compute_verdict(suspects: Mapping[int, float], peers: Mapping[int, float], *,
                    metric: Literal["seconds", "gflops"] = "seconds",
                    threshold: float = COMPUTE_THRESHOLD) -> ComputeVerdict:
    """Which suspects run the benchmark clearly slower than the healthy peers.

    Args:
        suspects: Benchmark result per suspect rank.
        peers: Benchmark result per healthy peer rank (at least one; disjoint from `suspects`).
        metric: ``"seconds"`` for the time the fixed benchmark took (throughput = 1/seconds) or ``"gflops"``.
        threshold: Slow below this fraction of the peers' median throughput (default 0.8).

    Raises:
        InputError: no peer, a rank both suspect and peer, a non-positive or non-finite value, a threshold
            outside (0, 1] or an unknown metric.
    """
    if metric not in ("seconds", "gflops"):
        raise InputError(f"unknown benchmark metric {metric!r} (seconds or gflops)")
    thr = _fraction(threshold, "compute threshold")
    sus, prs = _positive(suspects, "benchmark"), _positive(peers, "benchmark")
    if not prs:
        raise InputError("compute validation needs at least one healthy peer")
    both = set(sus) & set(prs)
    if both:
        raise InputError(f"ranks {sorted(both)} are both suspects and peers")
    ranks = sorted(sus) + sorted(prs)
    vals = np.array([sus[r] if r in sus else prs[r] for r in ranks], dtype=np.float64)
    tput = 1.0 / vals if metric == "seconds" else vals
    ref_tput = float(np.median(tput[len(sus):]))
    ratios = tput / ref_tput
    reference = 1.0 / ref_tput if metric == "seconds" else ref_tput
    ev = tuple(RankEvidence(r, i < len(sus), float(vals[i]), float(ratios[i]), bool(ratios[i] < thr))
               for i, r in enumerate(ranks))
    return ComputeVerdict(metric, thr, reference, ev)


# --- links -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkMeasurement:
    """One link's measured numbers.

    Attributes:
        a: One end (a node).
        b: The other end.
        bandwidth_Bps: Bytes per second of a large transfer (the slower direction where both were measured).
        latency_s: One-way small-message latency (half the round trip).
    """

    a: int
    b: int
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True)
class LinkEvidence:
    """One link against the reference links.

    Attributes:
        a, b: Its ends.
        suspect: Whether it was under suspicion (touches a suspect node or was named).
        bandwidth_Bps, latency_s: The measurement.
        bandwidth_ratio: Bandwidth over the reference median (1.0 = as fast).
        latency_ratio: Latency over the reference median (1.0 = as quick).
        slow: Bandwidth ratio below the fraction or latency ratio above the multiple.
        why: ``"bandwidth"``, ``"latency"``, ``"bandwidth+latency"`` or ``""``.
    """

    a: int
    b: int
    suspect: bool
    bandwidth_Bps: float
    latency_s: float
    bandwidth_ratio: float
    latency_ratio: float
    slow: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"a": self.a, "b": self.b, "suspect": self.suspect, "bandwidth_Bps": self.bandwidth_Bps,
                "latency_s": self.latency_s, "bandwidth_ratio": self.bandwidth_ratio,
                "latency_ratio": self.latency_ratio, "slow": self.slow, "why": self.why}


@dataclass(frozen=True)
class LinkVerdict:
    """The link validation's outcome with its evidence.

    Attributes:
        bandwidth_fraction: Slow below this fraction of the reference bandwidth.
        latency_multiple: Slow above this multiple of the reference latency.
        reference: ``"clean"`` (the links not under suspicion) or ``"all"`` (no suspect named, or no link clean).
        reference_bandwidth_Bps: The reference links' median bandwidth.
        reference_latency_s: The reference links' median latency.
        links: Evidence per link, in the order measured.
        nodes: Nodes named slow (see :func:`link_verdict`).
        ambiguous: Ends of slow links that the measurements cannot tell apart (two nodes measured only on the
            link between them, neither of them a suspect or both).
    """

    bandwidth_fraction: float
    latency_multiple: float
    reference: str
    reference_bandwidth_Bps: float
    reference_latency_s: float
    links: tuple[LinkEvidence, ...]
    nodes: tuple[int, ...]
    ambiguous: tuple[int, ...]

    @property
    def slow_links(self) -> tuple[Edge, ...]:
        """Links found slow."""
        return tuple((e.a, e.b) for e in self.links if e.slow)

    @property
    def cleared_links(self) -> tuple[Edge, ...]:
        """Suspect links found as fast as the reference."""
        return tuple((e.a, e.b) for e in self.links if e.suspect and not e.slow)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (with ``slow_links`` and ``cleared_links``)."""
        return {"kind": "links", "bandwidth_fraction": self.bandwidth_fraction,
                "latency_multiple": self.latency_multiple, "reference": self.reference,
                "reference_bandwidth_Bps": self.reference_bandwidth_Bps,
                "reference_latency_s": self.reference_latency_s, "nodes": list(self.nodes),
                "ambiguous": list(self.ambiguous), "slow_links": [list(e) for e in self.slow_links],
                "cleared_links": [list(e) for e in self.cleared_links], "links": [e.to_json() for e in self.links]}


def link_verdict(measurements: Sequence[LinkMeasurement], suspect_nodes: Iterable[int] = (),
                 suspect_links: Iterable[Edge] = (), *, bandwidth_fraction: float = LINK_BANDWIDTH_FRACTION,
                 latency_multiple: float = LINK_LATENCY_MULTIPLE) -> LinkVerdict:
    """Which links are slow against the healthy ones, and which nodes that points at.

    A link is under suspicion when it touches a suspect node or is a suspect link (either direction). The
    reference is the median bandwidth and latency of the links not under suspicion when something is under
    suspicion and at least :data:`MIN_CLEAN_LINKS` links are not, else the median of the faster half of all links (highest bandwidths,
    lowest latencies). Nodes: a node measured on two or more links is named when all of them are slow (a throttled
    NIC slows every link of its node; a slow link between two healthy nodes does not convict either). A node
    measured on one link only is named when that link is slow and the other end does not explain it (is not
    named itself); when both ends of a slow link are such one-link nodes, the suspect end is named, and
    with no suspect or both, the two are ``ambiguous``.

    Raises:
        InputError: no measurement, a repeated link, a link from a node to itself, a non-positive or
            non-finite number, a fraction outside (0, 1] or a multiple below 1.
    """
    frac = _fraction(bandwidth_fraction, "bandwidth fraction")
    if not (isinstance(latency_multiple, int | float) and math.isfinite(latency_multiple) and latency_multiple >= 1):
        raise InputError(f"latency multiple must be a finite number >= 1, got {latency_multiple!r}")
    if not measurements:
        raise InputError("link validation needs at least one measured link")
    sus_nodes = {int(n) for n in suspect_nodes}
    sus_links = {frozenset((int(a), int(b))) for a, b in suspect_links}
    keys: set[frozenset[int]] = set()
    for m in measurements:
        key = frozenset((m.a, m.b))
        if m.a == m.b or key in keys:
            raise InputError(f"link {(m.a, m.b)}: a link between two distinct nodes, measured once")
        keys.add(key)
        for name, v in (("bandwidth", m.bandwidth_Bps), ("latency", m.latency_s)):
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"link {(m.a, m.b)}: {name} must be finite and positive, got {v!r}")
    bw = np.array([m.bandwidth_Bps for m in measurements], dtype=np.float64)
    lat = np.array([m.latency_s for m in measurements], dtype=np.float64)
    suspect = np.array([m.a in sus_nodes or m.b in sus_nodes or frozenset((m.a, m.b)) in sus_links
                        for m in measurements], dtype=bool)
    if suspect.any() and (~suspect).sum() >= MIN_CLEAN_LINKS:
        ref_bw, ref_lat = float(np.median(bw[~suspect])), float(np.median(lat[~suspect]))
        label = "clean"
    else:
        # one or two clean links are one or two samples of a noisy quantity (a loaded host halves a link's
        # rate now and then): the faster half of every measured link is the reference, which stays healthy
        # while fewer than half of the links are slow
        half = max(1, (len(bw) + 1) // 2)
        ref_bw = float(np.median(np.sort(bw)[-half:]))
        ref_lat = float(np.median(np.sort(lat)[:half]))
        label = "all"
    bw_ratio, lat_ratio = bw / ref_bw, lat / ref_lat
    slow_bw, slow_lat = bw_ratio < frac, lat_ratio > latency_multiple
    ev = tuple(LinkEvidence(m.a, m.b, bool(suspect[i]), float(bw[i]), float(lat[i]), float(bw_ratio[i]),
                            float(lat_ratio[i]), bool(slow_bw[i] or slow_lat[i]),
                            "+".join(w for w, hit in (("bandwidth", slow_bw[i]), ("latency", slow_lat[i])) if hit))
               for i, m in enumerate(measurements))
    nodes, ambiguous = _name_nodes(ev, sus_nodes)
    return LinkVerdict(frac, float(latency_multiple), label, ref_bw, ref_lat, ev, nodes, ambiguous)


def _name_nodes(ev: Sequence[LinkEvidence], suspects: set[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    links_of: dict[int, list[LinkEvidence]] = {}
    for e in ev:
        links_of.setdefault(e.a, []).append(e)
        links_of.setdefault(e.b, []).append(e)
    named = {n for n, es in links_of.items() if len(es) >= 2 and all(e.slow for e in es)}
    ambiguous: set[int] = set()
    for e in ev:
        if not e.slow or e.a in named or e.b in named:
            continue
        ends = [n for n in (e.a, e.b) if len(links_of[n]) == 1]
        if len(ends) == 1:
            named.add(ends[0])
        elif len(ends) == 2:
            sus = [n for n in ends if n in suspects]
            if len(sus) == 1:
                named.add(sus[0])
            else:
                ambiguous.update(ends)
    return tuple(sorted(named)), tuple(sorted(ambiguous))
