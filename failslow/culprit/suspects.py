"""The verdicts both forms share (:func:`~failslow.culprit.analyse` from per-call timings,
:func:`~failslow.culprit.analyse_aggregates` from averages): slow pipeline stages, rank suspects
reconciled with them, and slow groups projected onto the node whose link they share."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from failslow.culprit.results import Culprit, GroupStat
from failslow.errors import InputError


def as_callable(f: Callable[[int], int] | Mapping[int, int]) -> Callable[[int], int]:
    """A rank map as a function: a mapping's lookup, or ``f`` itself."""
    return dict(f).__getitem__ if isinstance(f, Mapping) else f


#: A data-parallel group runs an uneven split when a member's micro-batches differ from the group's mean by
#: more than this share (a window's cut edges shift the counts by a call or two).
UNEVEN_SHARE = 0.03


def at_mean_work(outside: Mapping[int, float], sends: Mapping[int, float] | None,
                 fixed: Mapping[int, float] | None, peers_of: Callable[[int], Sequence[int]] | None,
                 first: Collection[int] = ()) -> tuple[dict[int, float], dict[int, float], set[int]]:
    """Each rank's time outside calls as if it ran its data-parallel group's mean number of micro-batches.

    After a micro-batch rebalance DP peers no longer do the same work: a replica given 13 micro-batches of
    16 computes four times what one given 3 does, and compared raw the healthy replica's ranks look like the
    stragglers while the slowed one hides. A rank's pipeline sends per iteration (`sends`) count its
    micro-batches (1F1B: one per micro-batch on a first or last stage, two on a middle one), so its
    per-micro-batch part is rescaled to its group's mean ``s``: ``f + (outside - f) * s / sends`` with `f` its
    compute that does not scale (`fixed`, the exporter's outside-pipeline compute: the optimizer step and
    what runs beside it; 0 when not told). On a `first` stage `f` also holds one micro-batch's forward and
    backward, so the rest covers ``sends - 1`` of them: ``f + (outside - f) * (s - 1) / (sends - 1)``. A rank
    is left as measured when it or a peer sent nothing (no pipeline, e.g. pure DP, or not known).

    Returns the rescaled times, for the rescaled ranks their share ``sends / s``, and the ranks of an uneven
    share whose fixed compute was not told (their rescaled time may be off either way: :func:`peer_ratios`).
    """
    out = {r: float(v) for r, v in outside.items()}
    shares: dict[int, float] = {}
    loose: set[int] = set()
    if not sends:
        return out, shares, loose
    for r, v in outside.items():
        group = {r, *(p for p in (peers_of(r) if peers_of is not None else outside) if p in outside)}
        w = [float(sends.get(p, float("nan"))) for p in group]
        if len(group) < 2 or not all(x > 0 for x in w):
            continue
        mean, mine = sum(w) / len(w), float(sends[r])
        f = float((fixed or {}).get(r, float("nan")))
        if f != f:  # not told
            f = 0.0
            if abs(mine / mean - 1.0) > UNEVEN_SHARE:
                loose.add(r)
        f = min(max(f, 0.0), float(v))
        held = 1.0 if r in first and f > 0 and mine > 1.0 and mean > 1.0 else 0.0
        out[r] = f + (float(v) - f) * (mean - held) / (mine - held)
        shares[r] = mine / mean
    return out, shares, loose


def peer_ratios(outside: Mapping[int, float], at_mean: Mapping[int, float], loose: Collection[int],
                peers_of: Callable[[int], Sequence[int]] | None) -> dict[int, float]:
    """Each rank's time outside calls over the median of its peers' (NaN without peers), both at their group's
    mean micro-batches (:func:`at_mean_work`). Where the rank or a peer is `loose` (an uneven share with its
    fixed compute not told: rescaling all of its time overstates a small share's step), the lower of that
    ratio and the measured one: an uneven split alone then names nobody, a rank slow either way still is."""
    out: dict[int, float] = {}
    for r in outside:
        mates = [p for p in (peers_of(r) if peers_of is not None else outside) if p != r and p in outside]
        ratio = float("nan")
        if mates:
            ref = float(np.median([at_mean[p] for p in mates]))
            ratio = at_mean[r] / ref if ref > 0 else float("nan")
            if loose and (r in loose or any(p in loose for p in mates)):
                raw = float(np.median([outside[p] for p in mates]))
                ratio = min(ratio, float(outside[r]) / raw if raw > 0 else float("nan"))
        out[r] = ratio
    return out


def stage_suspects(outside: Mapping[int, float], stage_of: Callable[[int], int],
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


def with_stages(ranks: list[Culprit], stages: list[Culprit], stage_of: Callable[[int], int],
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


def links_not_explained(groups: list[GroupStat], culprits: list[Culprit],
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
