"""Culprit analysis from per-window averages (a metrics pipeline): :func:`analyse_aggregates`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

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


def analyse_aggregates(outside_s: Mapping[int, float], group_call_s: Mapping[Any, Mapping[int, float]], *,
                       group_kind: Mapping[Any, str] | None = None,
                       node_of: Callable[[int], int] | Mapping[int, int] | None = None,
                       peers_of: Callable[[int], Sequence[int]] | None = None,
                       link_ratio: float = 1.1, compute_ratio: float = 1.1,
                       stage_of: Callable[[int], int] | Mapping[int, int] | None = None,
                       stage_work: Mapping[int, float] | None = None, stage_ratio: float = 1.3,
                       pipeline_sends: Mapping[int, float] | None = None,
                       fixed_s: Mapping[int, float] | None = None) -> Analysis:
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
        pipeline_sends: Rank -> pipeline sends per iteration (its micro-batches, on a first or last stage of a
            1F1B pipeline). Where a rank and its peers all sent some, each is compared at its group's mean
            number of micro-batches (:func:`~failslow.culprit.suspects.at_mean_work`): after a rebalance DP
            peers run unequal counts, and who waits for whom follows the split (no confidence from waits).
        fixed_s: Rank -> its time outside calls that does not scale with micro-batches (the exporter's
            outside-pipeline compute; on a first stage it holds one micro-batch, see ``at_mean_work``);
            0 where absent.
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
    ranks_all: list[int] = sorted(int(r) for r in outside_s)
    first = [r for r in ranks_all if as_callable(stage_of)(r) == 0] if stage_of is not None else []
    measured = {r: float(outside_s[r]) for r in ranks_all}
    out_f, shares, loose = at_mean_work(measured, pipeline_sends, fixed_s, peers_of, first)
    uneven = any(abs(x - 1.0) > UNEVEN_SHARE for x in shares.values())
    raw = []
    for key, per_rank in group_call_s.items():
        vals = {r: float(v) for r, v in per_rank.items() if v == v}
        if len(vals) < 2:
            continue
        transfer = min(vals.values())
        kind = group_kind.get(key, "") if group_kind is not None else ""
        if uneven and all(r in shares for r in vals):
            # A pipeline of fewer micro-batches waits more of each call in its fill and drain: only groups
            # running the same share are alike (a DP group's members average to the mean share).
            kind += f"@{sum(shares[r] for r in vals) / len(vals):.2f}"
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
    ratios = peer_ratios(measured, out_f, loose, peers_of)
    stats = [RankStat(rank=r, comm_s=float("nan"), outside_s=measured[r], wait_s=waited[r],
                      caused_s=float("nan"), last_fraction=float("nan"), ratio=ratios[r],
                      work_share=shares.get(r, float("nan"))) for r in ranks_all]
    for rs in stats:
        if rs.ratio == rs.ratio and rs.ratio >= compute_ratio:
            # Victims wait; the culprit does not: little waiting of its own adds to the confidence.
            peer_wait = [s.wait_s for s in stats if s.rank != rs.rank]
            low_wait = 1.0 if not peer_wait or rs.wait_s <= float(np.median(peer_wait)) else 0.5
            if uneven:  # who waits for whom follows the split, not the speed
                low_wait = 0.5
            conf = round(0.5 * min(1.0, (rs.ratio - 1.0) / 0.5) + 0.5 * low_wait, 3)
            evidence = {"outside_calls_ratio": round(rs.ratio, 3), "outside_calls_s": round(rs.outside_s, 6),
                        "wait_s": round(rs.wait_s, 6)}
            if rs.work_share == rs.work_share:
                evidence["microbatch_share"] = round(rs.work_share, 3)
            culprits.append(Culprit(kind="compute", rank=rs.rank, node=nodes(rs.rank) if nodes else None,
                                    ranks=(rs.rank,), confidence=conf, evidence=evidence))
    if stage_of is not None:
        stages = as_callable(stage_of)

        def wait_share(members: list[int]) -> float:
            # Without per-call times: how much of the waiting is done by the other ranks, not the stage's.
            own = float(np.median([waited[r] for r in members]))
            others = [waited[r] for r in ranks_all if r not in members]
            other = float(np.median(others)) if others else 0.0
            return other / (own + other) if own + other > 0 else 0.5

        culprits = with_stages(culprits, stage_suspects(out_f, stages, stage_work, stage_ratio, wait_share,
                                                        0.0, nodes), stages, out_f)
    # Averages cannot split a call into wait and transfer, and a compute straggler's delay reaches the
    # waits of every group downstream of it (all ranks synchronise), including groups it is not in: the
    # demo's gc fault on one rank made the other pipeline's P2P group look slow. So with a compute
    # suspect the averaged form names no link (a compute and a link fault at once shows the compute one).
    if not any(c.kind == "compute" for c in culprits):
        culprits.extend(links_not_explained(groups, culprits, nodes))
    culprits.sort(key=lambda c: -c.confidence)
    return Analysis(culprits=culprits, groups=groups, ranks=stats)
