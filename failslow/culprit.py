"""Culprit analysis: from per-rank call timings, tell the slow rank (compute) or slow link from their victims.

What it is for: once a job is confirmed slow, naming *who* to fix. Everybody in a synchronous job slows
down together, so iteration times cannot say who is guilty; the timing of communication calls can.

Every collective call instance (the k-th call on a communicator, matched across its members) splits into

* **wait**: from a rank's entry until the last peer arrives (``max(start) - start``), time spent waiting
  for somebody else, and
* **transfer**: from the last arrival to the rank's exit (``end - max(start)``), time the data took.

Point-to-point calls are matched as the k-th send from ``a`` to ``b`` with the k-th receive at ``b``
from ``a`` and split the same way. Then:

* **link suspects**: a group (communicator, or a directed p2p pair) whose median transfer time per byte
  is at least ``link_ratio`` (1.1×) the median of the groups of the same kind (same op, size and parallel
  role). The slow groups are then projected onto nodes: the node that the slow groups share and the
  healthy groups avoid is the suspect link (its uplink); a slow group confined to one node points at
  that node's local fabric.
* **compute suspects**: ranks everyone waits for. A rank slowed by its CPU/GPU spends *more* time outside
  communication calls than the ranks doing the same work (its data-parallel peers), and arrives last to
  its collectives; its victims spend the extra time *inside* calls (waiting), so their time outside
  calls stays normal. A rank is a suspect when its time outside calls is at least ``compute_ratio``
  (1.1×) the median of its peers.
* **stage suspects** (a compute suspect naming a whole pipeline stage): when every data-parallel rank of
  a stage is slow alike (a stage holding too many layers, longer sequences on one stage), comparing ranks
  with their DP peers sees nothing. Stages are compared with each other instead: the time outside calls
  of the stage's *fastest* rank, per unit of work the stage holds (layers, when known), against the
  median of the other stages. A stage at least ``stage_ratio`` (1.3×) the others is named with all its
  ranks (rank suspects inside it are explained by it; rank suspects elsewhere must explain at least as
  much extra time as the stage, else they are hidden behind the bottleneck); how much of the p2p waiting between it and its neighbours is theirs (they wait in receives for
  its sends) is part of the evidence and the confidence.

Each culprit comes with the evidence used and a confidence in [0, 1].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError
from failslow.ring import Op, RingReader, find_rings

#: Op codes (ring.Op) of point-to-point calls; everything else below 64 is a collective.
SEND, RECV = int(Op.SEND), int(Op.RECV)  # the record's op codes, as ints for array comparisons


@dataclass
class Calls:
    """Call timings of many ranks, one entry per call (parallel arrays).

    Attributes:
        rank: Global rank that made the call.
        comm: Communicator id (identical on every member).
        seq: Order of the call within the rank's stream (e.g. the ring sequence number).
        op: Op code (``failslow.ring.Op``).
        nranks: Size of the communicator.
        comm_rank: Position of the calling rank in the communicator.
        peer: For send/recv, the peer's position in the communicator (-1 otherwise).
        nbytes: Payload bytes.
        start: Entry time, seconds (one clock for all ranks: wall time).
        end: Exit/completion time, seconds.
    """

    rank: NDArray[np.int64]
    comm: NDArray[np.uint64]
    seq: NDArray[np.int64]
    op: NDArray[np.int64]
    nranks: NDArray[np.int64]
    comm_rank: NDArray[np.int64]
    peer: NDArray[np.int64]
    nbytes: NDArray[np.int64]
    start: NDArray[np.float64]
    end: NDArray[np.float64]

    def __post_init__(self) -> None:
        n = self.rank.shape[0]
        for name in ("comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes", "start", "end"):
            if getattr(self, name).shape != (n,):
                raise InputError(f"Calls.{name} must have shape ({n},), got {getattr(self, name).shape}")
        if n and (np.any(~np.isfinite(self.start)) or np.any(~np.isfinite(self.end))):
            raise InputError("call start/end times must be finite")
        if n and np.any(self.end < self.start):
            raise InputError("a call ends before it starts")

    @classmethod
    def from_columns(cls, **cols: Sequence[Any] | NDArray[Any]) -> Calls:
        """Build from lists/arrays; ``peer`` defaults to -1, ``nbytes`` to 0, ``seq`` to input order per rank."""
        n = len(cols["rank"])

        def col(name: str, dtype: Any, default: Any) -> NDArray[Any]:
            return np.asarray(cols[name], dtype=dtype) if name in cols else np.full(n, default, dtype=dtype)

        return cls(rank=col("rank", np.int64, 0), comm=col("comm", np.uint64, 0),
                   seq=col("seq", np.int64, 0) if "seq" in cols else np.arange(n, dtype=np.int64),
                   op=col("op", np.int64, 1), nranks=col("nranks", np.int64, 0),
                   comm_rank=col("comm_rank", np.int64, -1), peer=col("peer", np.int64, -1),
                   nbytes=col("nbytes", np.int64, 0), start=col("start", np.float64, 0.0),
                   end=col("end", np.float64, 0.0))

    @classmethod
    def concat(cls, parts: Sequence[Calls]) -> Calls:
        """Concatenate call sets."""
        if not parts:
            return cls.from_columns(rank=[])
        return cls(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in
                      ("rank", "comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes", "start", "end")})

    def __len__(self) -> int:
        return int(self.rank.shape[0])


def calls_from_records(records: NDArray[Any], rank: int, clock_offset_ns: int = 0,
                       call_ops: frozenset[int] | None = None) -> Calls:
    """Calls of one rank from ring records (``failslow.ring.RECORD_DTYPE``), in wall-clock seconds.

    Records without an end time (never completed) and control events (op >= 64) are dropped.
    """
    r = records
    ok = (r["t_end_ns"] > 0) & (r["t_start_ns"] > 0) & (r["t_end_ns"] >= r["t_start_ns"])
    ops = r["op"].astype(np.int64)
    ok &= np.isin(ops, list(call_ops)) if call_ops is not None else ((ops > 0) & (ops < 64))
    r = r[ok]
    n = r.shape[0]
    return Calls(rank=np.full(n, rank, dtype=np.int64), comm=r["comm"].astype(np.uint64),
                 seq=r["seq"].astype(np.int64), op=r["op"].astype(np.int64), nranks=r["nranks"].astype(np.int64),
                 comm_rank=r["comm_rank"].astype(np.int64), peer=r["peer"].astype(np.int64),
                 nbytes=r["bytes"].astype(np.int64),
                 start=(r["t_start_ns"].astype(np.int64) + clock_offset_ns) / 1e9,
                 end=(r["t_end_ns"].astype(np.int64) + clock_offset_ns) / 1e9)


# --------------------------------------------------------------------------- matching
@dataclass(frozen=True)
class Instance:
    """One matched call instance: who took part, when each arrived and left."""

    group: tuple[Any, ...]  # group key: ("coll", comm) or ("p2p", comm, src, dst)
    ranks: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    nbytes: int
    op: int

    @property
    def last_arrival(self) -> float:
        """When the last participant entered the call."""
        return max(self.start)

    def transfer(self) -> float:
        """Time from the last arrival to the median exit: what the data movement took.

        For a send/recv pair only the receiver's exit counts: a buffered send returns before the data
        has arrived, sometimes before the receiver even posted its receive.
        """
        la = self.last_arrival
        if self.group[0] == "p2p":
            return max(0.0, self.end[1] - la)
        return float(np.median([e - la for e in self.end]))

    def waits(self) -> tuple[float, ...]:
        """Per participant: time spent waiting for the last arrival (a sender never waits for a receiver)."""
        la = self.last_arrival
        if self.group[0] == "p2p":
            return (0.0, la - self.start[1])
        return tuple(la - s for s in self.start)


def calls_from_ring_dir(directory: Any) -> list[Calls]:
    """Calls of every ring in ``directory`` (e.g. kept after a job with ``FAILSLOW_KEEP_RINGS=1``), one per ring."""
    parts = []
    for path in find_rings(directory):
        r = RingReader(path)
        try:
            parts.append(calls_from_records(r.read_new(), r.header.rank, r.header.clock_offset_ns))
        finally:
            r.close()
    return parts


def match_instances(calls: Calls) -> list[Instance]:
    """Match calls across ranks into instances (collectives by communicator and order, p2p by pair and order).

    A collective instance is kept only if every member's call is present (a window cut in the middle
    of a call sequence leaves unmatched calls, which are dropped).
    """
    order = np.lexsort((calls.seq, calls.rank))
    members: dict[int, dict[int, int]] = defaultdict(dict)  # comm -> comm_rank -> global rank
    for i in order.tolist():
        if calls.comm_rank[i] >= 0:
            members[int(calls.comm[i])][int(calls.comm_rank[i])] = int(calls.rank[i])
    coll: dict[tuple[int, int], list[int]] = defaultdict(list)  # (comm, rank) -> call indices in order
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)  # (comm, src, dst)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i in order.tolist():
        op, comm, rk = int(calls.op[i]), int(calls.comm[i]), int(calls.rank[i])
        if op in (SEND, RECV):
            peer = members.get(comm, {}).get(int(calls.peer[i]))
            if peer is None:
                continue
            if op == SEND:
                sends[(comm, rk, peer)].append(i)
            else:
                recvs[(comm, peer, rk)].append(i)
        else:
            coll[(comm, rk)].append(i)
    out: list[Instance] = []
    by_comm: dict[int, list[int]] = defaultdict(list)
    for comm, rk in coll:
        by_comm[comm].append(rk)
    for comm, rks in by_comm.items():
        size = int(calls.nranks[coll[(comm, rks[0])][0]])
        if len(rks) < max(size, 2):
            continue  # not every member is visible: cannot tell who waited for whom
        rks.sort()
        lists = [coll[(comm, r)] for r in rks]
        offs = _align([calls.end[np.asarray(li)] for li in lists])
        k_max = min(len(li) - o for li, o in zip(lists, offs, strict=True))
        for k in range(k_max):
            idx = [li[k + o] for li, o in zip(lists, offs, strict=True)]
            out.append(Instance(group=("coll", comm), ranks=tuple(rks),
                                start=tuple(float(calls.start[i]) for i in idx),
                                end=tuple(float(calls.end[i]) for i in idx),
                                nbytes=int(max(calls.nbytes[i] for i in idx)), op=int(calls.op[idx[0]])))
    for key, s_list in sends.items():
        r_list = recvs.get(key, [])
        comm, src, dst = key
        for si, ri in zip(s_list, r_list, strict=False):
            out.append(Instance(group=("p2p", comm, src, dst), ranks=(src, dst),
                                start=(float(calls.start[si]), float(calls.start[ri])),
                                end=(float(calls.end[si]), float(calls.end[ri])),
                                nbytes=int(calls.nbytes[si]), op=SEND))
    return out


def _align(ends: list[NDArray[np.float64]], max_shift: int = 3) -> list[int]:
    """Per member of a communicator, how many of its first calls to skip so the k-th calls are one instance.

    A window cut between a fast member's call and a slow member's call of the same instance leaves the
    slow member one call ahead in the window; matching by position would then pair every call with the
    next instance's and make the fast member look like the last to arrive. Every member leaves a
    collective at about the same time (when the data is complete), so the shift that lines up exit
    times is the right one.
    """
    ref = ends[0]
    shifts = [0]
    for e in ends[1:]:
        best, best_cost = 0, float("inf")
        for d in sorted(range(-max_shift, max_shift + 1), key=abs):
            lo, hi = max(0, -d), min(ref.shape[0], e.shape[0] - d)
            if hi - lo < 1:
                continue
            cost = float(np.median(np.abs(e[lo + d:hi + d] - ref[lo:hi])))
            if cost < best_cost * 0.5 or (best_cost == float("inf")):
                best, best_cost = d, cost
        shifts.append(best)
    low = min(shifts)
    return [d - low for d in shifts]


# --------------------------------------------------------------------------- analysis
@dataclass(frozen=True)
class GroupStat:
    """Per-group summary over the analysed window.

    Attributes:
        key: ``("coll", comm)`` or ``("p2p", comm, src, dst)``.
        kind: Label of groups that should perform alike (op, size, role).
        ranks: Global ranks of the members.
        instances: Matched instances.
        transfer_s: Median transfer time of an instance (seconds).
        transfer_per_byte: Median transfer time per payload byte (transfer_s when bytes are unknown).
        ratio: ``transfer_per_byte`` over the median of the same-kind groups (NaN when alone in its kind).
        slow: Whether the group is a link suspect (ratio ≥ link_ratio).
    """

    key: tuple[Any, ...]
    kind: str
    ranks: tuple[int, ...]
    instances: int
    transfer_s: float
    transfer_per_byte: float
    ratio: float
    slow: bool


@dataclass(frozen=True)
class RankStat:
    """Per-rank summary over the analysed window.

    Attributes:
        rank: Global rank.
        comm_s: Time inside communication calls (seconds).
        outside_s: Time outside them (compute, data loading, host work).
        wait_s: Time spent waiting for the last peer in matched instances.
        caused_s: Waiting this rank caused others by arriving last.
        last_fraction: Fraction of its collective instances in which it arrived last.
        ratio: ``outside_s`` over the median of its peers' (NaN without peers).
    """

    rank: int
    comm_s: float
    outside_s: float
    wait_s: float
    caused_s: float
    last_fraction: float
    ratio: float


@dataclass(frozen=True)
class Culprit:
    """A suspect with its evidence.

    Attributes:
        kind: ``compute`` (a rank is slow) or ``link`` (a node's link or a group's transfers are slow).
        rank: The slow rank (compute suspects).
        node: The node whose link is slow (link suspects; None if it could not be localised).
        ranks: Ranks involved (the rank itself, or the members of the slow groups).
        confidence: 0..1.
        evidence: Figures behind the verdict, for humans and metrics.
        stage: The pipeline stage, for a compute suspect that is a whole stage (``rank`` is then None and
            ``ranks`` holds the stage's ranks).
    """

    kind: str
    rank: int | None
    node: int | None
    ranks: tuple[int, ...]
    confidence: float
    evidence: dict[str, Any] = field(default_factory=dict)
    stage: int | None = None


@dataclass
class Analysis:
    """Result of :func:`analyse`: culprits (most confident first) and the per-group/per-rank tables."""

    culprits: list[Culprit]
    groups: list[GroupStat]
    ranks: list[RankStat]

    @property
    def compute(self) -> list[Culprit]:
        """Compute suspects."""
        return [c for c in self.culprits if c.kind == "compute"]

    @property
    def link(self) -> list[Culprit]:
        """Link suspects."""
        return [c for c in self.culprits if c.kind == "link"]


def _union_time(starts: NDArray[np.float64], ends: NDArray[np.float64], lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi] (calls may overlap: async p2p)."""
    if starts.size == 0:
        return 0.0
    o = np.argsort(starts)
    s, e = np.clip(starts[o], lo, hi), np.clip(ends[o], lo, hi)
    total, cur_s, cur_e = 0.0, float(s[0]), float(e[0])
    for a, b in zip(s[1:].tolist(), e[1:].tolist(), strict=True):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + cur_e - cur_s


def analyse(calls: Calls, *, node_of: Callable[[int], int] | Mapping[int, int] | None = None,
            peers_of: Callable[[int], Sequence[int]] | None = None,
            group_role: Callable[[tuple[int, ...]], str] | None = None,
            link_ratio: float = 1.1, compute_ratio: float = 1.1, min_instances: int = 3,
            z: float = 3.0, min_share: float = 0.05,
            stage_of: Callable[[int], int] | Mapping[int, int] | None = None,
            stage_work: Mapping[int, float] | None = None, stage_ratio: float = 1.3) -> Analysis:
    """Name compute and link culprits from call timings.

    Args:
        calls: Call timings of every rank over the same window (wall clock).
        node_of: Rank -> node, to localise slow links (e.g. ``Layout.node_of``); without it link suspects
            name groups only.
        peers_of: Rank -> ranks doing the same work (e.g. its data-parallel group); default: all ranks.
        group_role: Group ranks -> role label ("dp", "pp", ...) so only like groups are compared.
        link_ratio: A group is slow when its transfer per byte is at least this times its kind's median.
        compute_ratio: A rank is slow when its time outside calls is at least this times its peers' median.
        min_instances: Groups with fewer matched instances are not judged.
        z: A slow group's excess over its kind's median must also be this many standard errors of its
            own median (from the spread of its instances), so jitter on a busy host is not a slow link.
        min_share: A suspect's excess (extra time outside calls of a rank; extra transfer time of a group,
            summed over its instances) must be at least this share of the window: a culprit has to
            explain a slowdown worth looking at, not a few percent of host noise.
        stage_of: Rank -> pipeline stage (e.g. ``lambda r: layout.coords(r).pp``); enables stage suspects.
        stage_work: Stage -> relative work it holds (e.g. its layer count); default: equal.
        stage_ratio: A stage is slow when its per-work time outside calls is at least this times the
            median of the other stages'. Higher than ``compute_ratio``: stages are never perfectly
            balanced (embedding, LM head), DP peers are, and the fastest rank of a stage is a noisier
            statistic on a contended host (CPU testbed under load: up to 1.28x with no stage fault).
    """
    if link_ratio <= 1.0 or compute_ratio <= 1.0 or stage_ratio <= 1.0:
        raise InputError("link_ratio, compute_ratio and stage_ratio must be above 1")
    if len(calls) == 0:
        raise InputError("no calls to analyse")
    nodes: Callable[[int], int] | None
    if node_of is None:
        nodes = None
    elif isinstance(node_of, Mapping):
        mapping = dict(node_of)
        nodes = mapping.__getitem__
    else:
        nodes = node_of
    inst = match_instances(calls)
    span = float(calls.end.max() - calls.start.min())

    # ---- groups and link suspects
    per_group: dict[tuple[Any, ...], list[Instance]] = defaultdict(list)
    for it in inst:
        per_group[it.group].append(it)
    raw: list[tuple[tuple[Any, ...], str, tuple[int, ...], int, float, float, float]] = []
    for key, its in per_group.items():
        if len(its) < min_instances:
            continue
        ranks = its[0].ranks
        role = group_role(tuple(sorted(ranks))) if group_role is not None else ""
        # Sends towards higher ranks (forward activations in Megatron order) and back are different traffic.
        direction = ("fwd" if key[2] < key[3] else "bwd") if key[0] == "p2p" else "coll"
        kind = f"{direction}:{its[0].op}:{len(ranks)}:{role}"
        tr = np.array([i.transfer() for i in its])
        nb = np.array([i.nbytes for i in its], dtype=np.float64)
        per_byte = tr / nb if np.all(nb > 0) else tr
        med = float(np.median(per_byte))
        # Standard error of the median, from the group's own spread: separates slow from noisy.
        se = 1.4826 * float(np.median(np.abs(per_byte - med))) * 1.2533 / np.sqrt(len(its))
        raw.append((key, kind, ranks, len(its), float(np.median(tr)), med, se))
    groups: list[GroupStat] = []
    by_kind: dict[str, list[float]] = defaultdict(list)
    for _, kind, _, _, _, pb, _ in raw:
        by_kind[kind].append(pb)
    for key, kind, ranks, n, tr_s, pb, se in raw:
        peers = by_kind[kind]
        ref = float(np.median(peers))
        ratio = pb / ref if len(peers) >= 2 and ref > 0 else float("nan")
        ref_s = float(np.median([row[4] for row in raw if row[1] == kind]))
        # Significant (beyond the group's own jitter) and material (a share of the wall time).
        slow_g = (bool(ratio >= link_ratio) and pb - ref >= z * se
                  and (tr_s - ref_s) * n >= min_share * span)
        groups.append(GroupStat(key=key, kind=kind, ranks=ranks, instances=n, transfer_s=tr_s,
                                transfer_per_byte=pb, ratio=ratio, slow=slow_g))

    culprits: list[Culprit] = []

    # ---- ranks and compute suspects
    lo, hi = float(calls.start.min()), float(calls.end.max())
    all_ranks: list[int] = sorted({int(r) for r in calls.rank.tolist()})
    wait: dict[int, float] = defaultdict(float)
    caused: dict[int, float] = defaultdict(float)
    last: dict[int, int] = defaultdict(int)
    seen: dict[int, int] = defaultdict(int)
    p2p_caused: dict[int, float] = defaultdict(float)  # receivers' waits for this rank's sends
    p2p_waited: dict[int, float] = defaultdict(float)  # this rank's waits in its receives
    for it in inst:
        ws = it.waits()
        for r, w in zip(it.ranks, ws, strict=True):
            wait[r] += w
        if it.group[0] == "p2p":
            p2p_caused[it.ranks[0]] += ws[1]
            p2p_waited[it.ranks[1]] += ws[1]
        if it.group[0] == "coll":
            j = int(np.argmax(it.start))
            caused[it.ranks[j]] += sum(ws)
            last[it.ranks[j]] += 1
            for r in it.ranks:
                seen[r] += 1
    comm_s: dict[int, float] = {}
    outside: dict[int, float] = {}
    for r in all_ranks:
        m = calls.rank == r
        # Each rank's own span: ranks that start later or stop earlier are not charged for it.
        r_lo, r_hi = max(lo, float(calls.start[m].min())), min(hi, float(calls.end[m].max()))
        comm_s[r] = _union_time(calls.start[m], calls.end[m], r_lo, r_hi)
        outside[r] = max(0.0, (r_hi - r_lo) - comm_s[r])
    rank_stats: list[RankStat] = []
    for r in all_ranks:
        mates = [p for p in (peers_of(r) if peers_of is not None else all_ranks) if p != r and p in outside]
        ref = float(np.median([outside[p] for p in mates])) if mates else float("nan")
        ratio = outside[r] / ref if mates and ref > 0 else float("nan")
        rank_stats.append(RankStat(rank=r, comm_s=comm_s[r], outside_s=outside[r], wait_s=wait[r],
                                   caused_s=caused[r], last_fraction=last[r] / seen[r] if seen[r] else float("nan"),
                                   ratio=ratio))
    for rs in rank_stats:
        lastf = rs.last_fraction if rs.last_fraction == rs.last_fraction else 0.5
        # A compute suspect works longer than its peers *and* is the one the others wait for.
        ref_out = rs.outside_s / rs.ratio if rs.ratio == rs.ratio and rs.ratio > 0 else rs.outside_s
        if (rs.ratio == rs.ratio and rs.ratio >= compute_ratio and lastf >= 0.5
                and rs.outside_s - ref_out >= min_share * span):
            excess = min(1.0, (rs.ratio - 1.0) / 0.5)
            conf = round(0.5 * excess + 0.5 * lastf, 3)
            culprits.append(Culprit(
                kind="compute", rank=rs.rank, node=nodes(rs.rank) if nodes is not None else None,
                ranks=(rs.rank,), confidence=conf,
                evidence={"outside_calls_ratio": round(rs.ratio, 3), "outside_calls_s": round(rs.outside_s, 6),
                          "last_arrival_fraction": None if rs.last_fraction != rs.last_fraction
                          else round(rs.last_fraction, 3), "caused_wait_s": round(rs.caused_s, 6)}))
    if stage_of is not None:
        stages = _as_callable(stage_of)

        def p2p_share(members: list[int]) -> float:
            caused = sum(p2p_caused[r] for r in members)
            waited = sum(p2p_waited[r] for r in members)
            return caused / (caused + waited) if caused + waited > 0 else 0.5

        culprits = _with_stages(culprits, _stage_suspects(outside, stages, stage_work, stage_ratio, p2p_share,
                                                          min_share * span, nodes), stages, outside)
    culprits.extend(_links_not_explained(groups, culprits, nodes))
    culprits.sort(key=lambda c: -c.confidence)
    return Analysis(culprits=culprits, groups=groups, ranks=rank_stats)


def _as_callable(f: Callable[[int], int] | Mapping[int, int]) -> Callable[[int], int]:
    return dict(f).__getitem__ if isinstance(f, Mapping) else f


def _stage_suspects(outside: Mapping[int, float], stage_of: Callable[[int], int],
                    stage_work: Mapping[int, float] | None, stage_ratio: float,
                    p2p_share: Callable[[list[int]], float], min_excess_s: float,
                    nodes: Callable[[int], int] | None) -> list[Culprit]:
    """Whole pipeline stages that compute slower than the others (every DP rank of the stage alike).

    A stage's time is that of its *fastest* rank (per unit of work): a stage is slow only if all its
    ranks are, so one starved rank (a rank-level compute suspect) does not make its stage a suspect
    and the stage's victims (other stages, waiting inside p2p calls) keep a normal time outside calls.
    ``p2p_share`` says how much of the p2p waiting between the stage and its neighbours is the
    neighbours waiting for it (a bottleneck stage makes the others wait); it weighs in the confidence.
    """
    members: dict[int, list[int]] = defaultdict(list)
    for r in sorted(outside):
        members[int(stage_of(r))].append(r)
    if len(members) < 2:
        return []
    work = {s: float(stage_work.get(s, 1.0)) if stage_work is not None else 1.0 for s in members}
    if any(not (w > 0) for w in work.values()):
        raise InputError(f"stage work must be positive, got {work}")
    per_work = {s: min(outside[r] for r in rs) / work[s] for s, rs in members.items()}
    out: list[Culprit] = []
    for s, rs in members.items():
        ref = float(np.median([v for t, v in per_work.items() if t != s]))
        if not ref > 0:
            continue
        ratio = per_work[s] / ref
        excess_s = (per_work[s] - ref) * work[s]
        share = p2p_share(rs)
        # The p2p share is evidence, not a gate: with few micro-batches every stage waits for every other
        # (no overlap), so the share says little; the slowest rank-free comparison is the stage's time.
        if ratio >= stage_ratio and excess_s >= min_excess_s:
            conf = round(0.5 * min(1.0, (ratio - 1.0) / 0.5) + 0.5 * share, 3)
            node_set = sorted({nodes(r) for r in rs}) if nodes is not None else []
            out.append(Culprit(
                kind="compute", rank=None, node=node_set[0] if len(node_set) == 1 else None, ranks=tuple(rs),
                confidence=conf, stage=s,
                evidence={"stage": s, "stage_compute_ratio": round(ratio, 3),
                          "stage_outside_calls_s": round(per_work[s] * work[s], 6),
                          "other_stages_outside_calls_s": round(ref * work[s], 6),
                          "work": work[s], "excess_s": round(excess_s, 6),
                          "p2p_wait_caused_share": round(share, 3)}))
    return out


def _with_stages(ranks: list[Culprit], stages: list[Culprit], stage_of: Callable[[int], int],
                 outside: Mapping[int, float]) -> list[Culprit]:
    """Rank suspects reconciled with stage suspects: the pipeline runs at its slowest stage's pace.

    * A rank suspect inside a slow stage is explained by it: when every rank of a stage computes
      longer, the differences between them are second order (and host noise grows with the load).
    * A rank suspect in another stage is kept only if its excess over its DP peers is at least the
      slow stage's excess: a smaller one is hidden behind the bottleneck (its DP peers wait for it,
      the pipeline waits for the bottleneck stage), so it does not explain the slowdown.
    """
    if not stages:
        return ranks
    slow = {c.stage for c in stages}
    worst = max(float(c.evidence["excess_s"]) for c in stages)
    kept = []
    for c in ranks:
        if c.kind == "compute" and c.rank is not None:
            ratio = float(c.evidence.get("outside_calls_ratio", float("nan")))
            excess = outside[c.rank] * (1.0 - 1.0 / ratio) if ratio > 0 else 0.0
            if stage_of(c.rank) in slow or excess < worst:
                continue
        kept.append(c)
    return kept + stages


def _links_not_explained(groups: list[GroupStat], culprits: list[Culprit],
                         nodes: Callable[[int], int] | None) -> list[Culprit]:
    """Link suspects from slow groups, except groups that contain a compute suspect.

    A CPU-starved rank also moves its collectives' data slowly (gloo, NCCL proxies and host staging run
    on its CPU), so a slow group that contains a compute suspect is explained by it, not by a link.
    """
    busy = {c.rank for c in culprits if c.kind == "compute"}
    slow = [g for g in groups if g.slow and not busy.intersection(g.ranks)]
    if not slow:
        return []
    healthy = [g for g in groups if not g.slow and g.ratio == g.ratio]
    return _localise_links(slow, healthy, nodes)


def _localise_links(slow: list[GroupStat], healthy: list[GroupStat],
                    nodes: Callable[[int], int] | None) -> list[Culprit]:
    """Project slow groups onto nodes: the node the slow groups share and healthy groups avoid."""
    worst = max(g.ratio for g in slow)
    ranks = tuple(sorted({r for g in slow for r in g.ranks}))
    ev_groups = [{"group": _key_str(g.key), "ranks": list(g.ranks), "ratio": round(g.ratio, 3)} for g in slow]
    if nodes is None:
        return [Culprit(kind="link", rank=None, node=None, ranks=ranks,
                        confidence=round(min(1.0, (worst - 1.0) / 0.5), 3),
                        evidence={"slow_groups": ev_groups})]
    slow_sets = [{nodes(r) for r in g.ranks} for g in slow]
    healthy_sets = [{nodes(r) for r in g.ranks} for g in healthy]
    cand = sorted(set().union(*slow_sets))
    scores: dict[int, float] = {}
    for n in cand:
        in_slow = sum(n in s for s in slow_sets) / len(slow_sets)
        in_healthy = (sum(n in s for s in healthy_sets if len(s) > 1) / max(1, sum(len(s) > 1 for s in healthy_sets)))
        scores[n] = in_slow - in_healthy
    best = max(scores.values())
    top = [n for n, s in scores.items() if s >= best - 1e-9]
    out = []
    for n in top:
        conf = round(max(0.0, min(1.0, best)) * min(1.0, (worst - 1.0) / 0.3 + 0.5) / max(1, len(top)), 3)
        out.append(Culprit(kind="link", rank=None, node=n, ranks=ranks, confidence=conf,
                           evidence={"slow_groups": ev_groups, "node_score": round(scores[n], 3),
                                     "intra_node": all(len(s) == 1 for s in slow_sets)}))
    return out


def _key_str(key: tuple[Any, ...]) -> str:
    def ident(v: Any) -> str:
        return f"{v:x}" if isinstance(v, int) else str(v)

    if key[0] == "p2p":
        return f"p2p:{ident(key[1])}:{key[2]}->{key[3]}"
    return f"{key[0]}:{ident(key[1])}"


# --------------------------------------------------------------------------- aggregated form
def analyse_aggregates(outside_s: Mapping[int, float], group_call_s: Mapping[Any, Mapping[int, float]], *,
                       group_kind: Mapping[Any, str] | None = None,
                       node_of: Callable[[int], int] | Mapping[int, int] | None = None,
                       peers_of: Callable[[int], Sequence[int]] | None = None,
                       link_ratio: float = 1.1, compute_ratio: float = 1.1,
                       stage_of: Callable[[int], int] | Mapping[int, int] | None = None,
                       stage_work: Mapping[int, float] | None = None, stage_ratio: float = 1.3) -> Analysis:
    """The same verdicts from per-window averages, as a metrics pipeline (Prometheus) provides them.

    Without per-call timestamps the wait/transfer split is estimated per group: in a collective the
    last rank to arrive does not wait, so the *smallest* mean call time of the members approximates the
    transfer time, and each member's excess over it approximates its wait.

    Args:
        outside_s: Rank -> mean time per iteration outside communication calls (compute, host work).
        group_call_s: Group key -> {rank: mean time per call inside that group's calls}.
        group_kind: Group key -> label of groups that should perform alike (role, op, size).
        node_of: Rank -> node, to localise slow links.
        peers_of: Rank -> ranks doing the same work (default: every rank in ``outside_s``).
        link_ratio: Slow-group threshold over the median transfer estimate of the same kind.
        compute_ratio: Slow-rank threshold over the peers' median time outside calls.
        stage_of: Rank -> pipeline stage; enables stage suspects (as in :func:`analyse`).
        stage_work: Stage -> relative work it holds (e.g. layers); default: equal.
        stage_ratio: Slow-stage threshold over the other stages' median per-work time outside calls.
    """
    if link_ratio <= 1.0 or compute_ratio <= 1.0 or stage_ratio <= 1.0:
        raise InputError("link_ratio, compute_ratio and stage_ratio must be above 1")
    nodes: Callable[[int], int] | None
    if node_of is None:
        nodes = None
    elif isinstance(node_of, Mapping):
        nodes = dict(node_of).__getitem__
    else:
        nodes = node_of
    raw = []
    for key, per_rank in group_call_s.items():
        vals = {r: float(v) for r, v in per_rank.items() if v == v}
        if len(vals) < 2:
            continue
        transfer = min(vals.values())
        kind = group_kind.get(key, "") if group_kind is not None else ""
        raw.append((key, kind, tuple(sorted(vals)), transfer))
    by_kind: dict[str, list[float]] = defaultdict(list)
    for _, kind, _, tr in raw:
        by_kind[kind].append(tr)
    groups = []
    for key, kind, ranks, tr in raw:
        peers = by_kind[kind]
        med = float(np.median(peers))
        ratio = tr / med if len(peers) >= 2 and med > 0 else float("nan")
        groups.append(GroupStat(key=key if isinstance(key, tuple) else ("agg", key), kind=kind, ranks=ranks,
                                instances=0, transfer_s=tr, transfer_per_byte=tr, ratio=ratio,
                                slow=bool(ratio >= link_ratio)))
    culprits: list[Culprit] = []
    waited: dict[int, float] = defaultdict(float)
    for per_rank in group_call_s.values():
        vals = {r: float(v) for r, v in per_rank.items() if v == v}
        if len(vals) >= 2:
            tr = min(vals.values())
            for r, v in vals.items():
                waited[r] += v - tr
    ranks_all: list[int] = sorted(int(r) for r in outside_s)
    stats = []
    for r in ranks_all:
        mates = [p for p in (peers_of(r) if peers_of is not None else ranks_all) if p != r and p in outside_s]
        ref = float(np.median([outside_s[p] for p in mates])) if mates else float("nan")
        ratio = float(outside_s[r]) / ref if mates and ref > 0 else float("nan")
        stats.append(RankStat(rank=r, comm_s=float("nan"), outside_s=float(outside_s[r]), wait_s=waited[r],
                              caused_s=float("nan"), last_fraction=float("nan"), ratio=ratio))
    for rs in stats:
        if rs.ratio == rs.ratio and rs.ratio >= compute_ratio:
            # Victims wait; the culprit does not: little waiting of its own adds to the confidence.
            peer_wait = [s.wait_s for s in stats if s.rank != rs.rank]
            low_wait = 1.0 if not peer_wait or rs.wait_s <= float(np.median(peer_wait)) else 0.5
            conf = round(0.5 * min(1.0, (rs.ratio - 1.0) / 0.5) + 0.5 * low_wait, 3)
            culprits.append(Culprit(kind="compute", rank=rs.rank, node=nodes(rs.rank) if nodes else None,
                                    ranks=(rs.rank,), confidence=conf,
                                    evidence={"outside_calls_ratio": round(rs.ratio, 3),
                                              "outside_calls_s": round(rs.outside_s, 6),
                                              "wait_s": round(rs.wait_s, 6)}))
    if stage_of is not None:
        stages = _as_callable(stage_of)

        def wait_share(members: list[int]) -> float:
            # Without per-call times: how much of the waiting is done by the other ranks, not the stage's.
            own = float(np.median([waited[r] for r in members]))
            others = [waited[r] for r in ranks_all if r not in members]
            other = float(np.median(others)) if others else 0.0
            return other / (own + other) if own + other > 0 else 0.5

        out_f = {r: float(outside_s[r]) for r in ranks_all}
        culprits = _with_stages(culprits, _stage_suspects(out_f, stages, stage_work, stage_ratio, wait_share,
                                                          0.0, nodes), stages, out_f)
    # Averages cannot split a call into wait and transfer, and a compute straggler's delay reaches the
    # waits of every group downstream of it (all ranks synchronise), including groups it is not in: the
    # demo's gc fault on one rank made the other pipeline's P2P group look slow. So with a compute
    # suspect the averaged form names no link (a compute and a link fault at once shows the compute one).
    if not any(c.kind == "compute" for c in culprits):
        culprits.extend(_links_not_explained(groups, culprits, nodes))
    culprits.sort(key=lambda c: -c.confidence)
    return Analysis(culprits=culprits, groups=groups, ranks=stats)
