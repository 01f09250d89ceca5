"""Culprit analysis from per-call timings: :func:`analyse` (DP peers, cross-stage comparison, node map)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.culprit.instances import Instance, match_instances
from failslow.culprit.results import Analysis, Culprit, GroupStat, RankStat
from failslow.culprit.suspects import (
    UNEVEN_SHARE,
    as_callable,
    at_mean_work,
    links_not_explained,
    peer_ratios,
    stage_suspects,
    with_stages,
)
from failslow.errors import InputError
from failslow.record.calls import RECV, SEND, Calls


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


def _pipeline_work(calls: Calls, ranks: Sequence[int], dp_group: Callable[[int], frozenset[int]] | None
                   ) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank with pipeline sends in the window: its sends per iteration and its compute in the stretches
    between two pipeline sends/receives that hold a call of its data-parallel group (the optimizer step and
    what runs beside it: the exporter's outside-pipeline compute, summed over the window). An iteration is
    such a stretch; where a rank has none (no `dp_group`, a pipeline without data parallelism, a short
    window) the sends of every rank are the window's counts, and no fixed compute is told."""
    members: dict[int, set[int]] = defaultdict(set)
    for c, r in zip(calls.comm.tolist(), calls.rank.tolist(), strict=True):
        members[int(c)].add(int(r))
    sends: dict[int, float] = {}
    fixed: dict[int, float] = {}
    per_iteration: dict[int, float] = {}
    for r in ranks:
        m = calls.rank == r
        ops = calls.op[m]
        n_sends = int((ops == SEND).sum())
        if not n_sends:
            continue
        sends[r] = float(n_sends)
        if dp_group is None:
            continue
        group = dp_group(r)
        o = np.argsort(calls.start[m], kind="stable")
        starts, ends = calls.start[m][o].tolist(), calls.end[m][o].tolist()
        p2p, comms = np.isin(ops[o], (SEND, RECV)).tolist(), calls.comm[m][o].tolist()
        total, stretches, lo, own = 0.0, 0, None, False
        inside: list[tuple[float, float]] = []
        for a, b, pt, c in zip(starts, ends, p2p, comms, strict=True):
            if pt:
                if lo is not None and own and a > lo:
                    st, en = np.array([x for x, _ in inside]), np.array([y for _, y in inside])
                    total += (a - lo) - _union_time(st, en, lo, a)
                    stretches += 1
                lo = b if lo is None else max(lo, b)
                inside, own = [], False
                continue
            inside.append((a, b))
            own = own or members.get(int(c), set()) == group
        if stretches:
            fixed[r], per_iteration[r] = total, n_sends / stretches
    if per_iteration and set(per_iteration) == set(sends):
        return per_iteration, fixed
    return sends, {}


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
    dp_group = None if peers_of is None else (lambda r: frozenset({r, *peers_of(r)}))
    sends, fixed = _pipeline_work(calls, all_ranks, dp_group)
    first = () if stage_of is None else [r for r in fixed if as_callable(stage_of)(r) == 0]
    at_mean, shares, loose = at_mean_work(outside, sends, fixed, peers_of, first)
    ratios = peer_ratios(outside, at_mean, loose, peers_of)

    def uneven(r: int) -> bool:
        group = [r, *(peers_of(r) if peers_of is not None else all_ranks)]
        return any(abs(shares.get(p, 1.0) - 1.0) > UNEVEN_SHARE for p in group)

    rank_stats: list[RankStat] = []
    for r in all_ranks:
        rank_stats.append(RankStat(rank=r, comm_s=comm_s[r], outside_s=outside[r], wait_s=wait[r],
                                   caused_s=caused[r], last_fraction=last[r] / seen[r] if seen[r] else float("nan"),
                                   ratio=ratios[r], work_share=shares.get(r, float("nan"))))
    for rs in rank_stats:
        lastf = rs.last_fraction if rs.last_fraction == rs.last_fraction else 0.5
        if uneven(rs.rank):  # who arrives last follows the split, not the speed: no evidence either way
            lastf = 0.5
        # A compute suspect works longer than its peers *and* is the one the others wait for.
        mine = at_mean[rs.rank]
        ref_out = mine / rs.ratio if rs.ratio == rs.ratio and rs.ratio > 0 else mine
        if (rs.ratio == rs.ratio and rs.ratio >= compute_ratio and lastf >= 0.5
                and mine - ref_out >= min_share * span):
            excess = min(1.0, (rs.ratio - 1.0) / 0.5)
            conf = round(0.5 * excess + 0.5 * lastf, 3)
            evidence = {"outside_calls_ratio": round(rs.ratio, 3), "outside_calls_s": round(rs.outside_s, 6),
                        "last_arrival_fraction": None if rs.last_fraction != rs.last_fraction
                        else round(rs.last_fraction, 3), "caused_wait_s": round(rs.caused_s, 6)}
            if rs.work_share == rs.work_share:
                evidence["microbatch_share"] = round(rs.work_share, 3)
            culprits.append(Culprit(kind="compute", rank=rs.rank, node=nodes(rs.rank) if nodes is not None else None,
                                    ranks=(rs.rank,), confidence=conf, evidence=evidence))
    if stage_of is not None:
        stages = as_callable(stage_of)

        def p2p_share(members: list[int]) -> float:
            caused = sum(p2p_caused[r] for r in members)
            waited = sum(p2p_waited[r] for r in members)
            return caused / (caused + waited) if caused + waited > 0 else 0.5

        culprits = with_stages(culprits, stage_suspects(at_mean, stages, stage_work, stage_ratio, p2p_share,
                                                        min_share * span, nodes), stages, at_mean)
    culprits.extend(links_not_explained(groups, culprits, nodes))
    culprits.sort(key=lambda c: -c.confidence)
    return Analysis(culprits=culprits, groups=groups, ranks=rank_stats)
