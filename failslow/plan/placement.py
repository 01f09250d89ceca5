"""S3 topology adjustment, pure: which node should host which ranks once a link or a GPU has gone slow.

FALCON's third mitigation level re-places a running job: a congested link is moved out of the heavy
data-parallel (and tensor-parallel) traffic into a light pipeline hop or out of use (its node swap), and slow
GPUs are gathered into as few pipeline stages as possible (consolidation). This module scores placements
with an analytic iteration-time model and picks the best one, or refuses when none pays.

A placement is a node permutation: the ranks a node hosts move together and slowness stays with the
hardware. The planner in parts: the traffic and time parameters (:mod:`failslow.plan.placement_params`),
the iteration-time model and its calibration (:mod:`failslow.plan.placement_model`), each placement under
its best micro-batch split (:mod:`failslow.plan.placement_split`), the generated candidates
(:mod:`failslow.plan.placement_moves`) and the search (:mod:`failslow.plan.placement_search`); this
module plans with them (:func:`plan_topology`) and turns the detector's suspects into slowness
(:func:`suspect_slowness`).

**Search.** Up to :data:`EXHAUSTIVE_MAX_NODES` nodes (8: 40,320 placements) every node permutation is
scored, vectorised with numpy, so the best is exact. Above that, a deterministic local search: from the
current placement and the best generated candidate, take the best swap of a suspect node (one with a slow
slot or a congested link) with any node while it improves, at most ``4 * suspects + 4`` steps. Besides the
search, two families of candidates are generated, scored and listed with a reason: link moves (swap a
congested node, or an end of a congested path, with every other node) and consolidation (the slow nodes into
``ceil(k / nodes per stage)`` stages, interior stages first). Exact ties go to the placement that moves the
fewest nodes, then the one with the fewest slow slots in an edge stage.

**Moves that pay with a rebalance** (``rebalance=True``). With compute stragglers in several DP replicas every
replica is slow, so S2 cannot help, and gathering the slow GPUs into one replica scores no better under the
job's current split: only the move followed by an S2 split pays (FALCON's consolidation, Fig. 16). With
``rebalance`` every placement is scored under its own best split of the same total ``M``: ``overhead + min
over integers m_d >= 1 (m_d <= an optional upper bound), sum m_d = M, of max_d (m_d t_d + o_d) + its
all-reduce``. Over all placements at once this is a search on the makespan ``T`` (the smallest ``T`` with
``sum_d clip(floor((T - o_d) / t_d), 1, upper_d) >= M``, settled per element on the exact expression
``k t_d + o_d <= T``, so it is the value :func:`failslow.plan.microbatch.rebalance` reaches to the last bit);
the listed candidates then get their split from that solver. The current placement is scored with its best
split too, so a move is only chosen when it beats S2 alone, and consolidation also gathers the slow nodes
into as few replicas as possible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

from failslow.errors import InputError
from failslow.plan.pace import PaceModel
from failslow.plan.placement_model import IterationTime, PlacementModel, bisect_rising
from failslow.plan.placement_moves import consolidations, link_moves
from failslow.plan.placement_params import IntArray, LinkKey, PlacementParams
from failslow.plan.placement_search import EXHAUSTIVE_MAX_NODES, all_permutations, best_of, local_search
from failslow.plan.placement_split import min_makespan
from failslow.plan.policy_views import Suspect, TopologyOption
from failslow.topology import Layout

__all__: list[str] = [
    "DEFAULT_LINK_SHARE", "DEFAULT_SLOW_FACTOR", "EXHAUSTIVE_MAX_NODES", "IterationTime", "LinkKey",
    "PlacementCandidate", "PlacementModel", "PlacementParams", "TopologyPlan", "fit_slowness", "min_makespan",
    "plan_topology", "suspect_slowness"]


@dataclass(frozen=True)
class PlacementCandidate:
    """One scored placement.

    Attributes:
        placement: Node of each rank.
        predicted_s: Predicted iteration time.
        why: What the move does, for people.
        source: ``link`` (link move), ``consolidate``, ``search`` (exhaustive or local search).
        moved: Nodes that host other ranks than now.
        counts: The micro-batch split per DP replica the prediction assumes (planned with ``rebalance``);
            None: the job's current split.
    """

    placement: tuple[int, ...]
    predicted_s: float
    why: str
    source: str
    moved: tuple[int, ...]
    counts: tuple[int, ...] | None = None

    def to_option(self) -> TopologyOption:
        """The form the ski-rental planner takes (`failslow.plan.policy.JobView.topology`)."""
        return TopologyOption(placement=self.placement, predicted_s=self.predicted_s, why=self.why,
                              counts=self.counts)

    def to_json(self, current_s: float | None = None) -> dict[str, Any]:
        """Plain JSON form (``counts`` only when set); with `current_s`, also the predicted relative gain."""
        doc: dict[str, Any] = {"placement": list(self.placement), "predicted_s": self.predicted_s,
                               "source": self.source, "moved_nodes": list(self.moved), "why": self.why}
        if self.counts is not None:
            doc["counts"] = list(self.counts)
        if current_s:
            doc["gain"] = 1.0 - self.predicted_s / current_s
        return doc


@dataclass(frozen=True)
class TopologyPlan:
    """The S3 planner's answer.

    Attributes:
        current_s: Predicted (calibrated: measured) iteration time of the current placement; with `rebalance`,
            under its best micro-batch split (what S2 alone would reach), the time every move is measured
            against.
        current: Its breakdown (with `rebalance`, its ``counts`` are that split).
        candidates: Scored placements other than the current one, best first.
        chosen: The placement to move to, or None (see `reason`).
        reason: Why `chosen` was taken or why none was.
        method: ``exhaustive`` or ``local-search``.
        evaluated: Placements the search scored.
        min_gain: The relative gain a move had to predict.
        params: The model parameters used (after calibration).
        rebalance: Every placement was scored under its own best micro-batch split.
        as_is_s: With `rebalance`, the current placement under the job's current split (without: None).
    """

    current_s: float
    current: IterationTime
    candidates: tuple[PlacementCandidate, ...]
    chosen: PlacementCandidate | None
    reason: str
    method: str
    evaluated: int
    min_gain: float
    params: PlacementParams
    rebalance: bool = False
    as_is_s: float | None = None

    def options(self) -> tuple[TopologyOption, ...]:
        """What the ski-rental planner should weigh: the chosen placement first, then every other one that
        beats the current placement by `min_gain`; nothing when the plan refused."""
        if self.chosen is None:
            return ()
        limit = (1.0 - self.min_gain) * self.current_s
        rest = [c.to_option() for c in self.candidates if c is not self.chosen and c.predicted_s <= limit]
        return (self.chosen.to_option(), *rest)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (what `failslow plan topology` prints; ``rebalance`` and ``as_is_s`` only when
        planned with `rebalance`)."""
        doc: dict[str, Any] = {
            "current_s": self.current_s, "current": self.current.to_json(),
            "chosen": None if self.chosen is None else self.chosen.to_json(self.current_s),
            "reason": self.reason, "method": self.method, "evaluated": self.evaluated, "min_gain": self.min_gain,
            "candidates": [c.to_json(self.current_s) for c in self.candidates], "params": self.params.to_json()}
        if self.rebalance:
            doc["rebalance"] = True
            doc["as_is_s"] = self.as_is_s
        return doc


def plan_topology(layout: Layout, placement: Sequence[int] | None = None, *,
                  slow_ranks: Mapping[int, float] | None = None,
                  slow_links: Mapping[LinkKey, float] | None = None,
                  params: PlacementParams | None = None, iteration_s: float | None = None,
                  healthy_s: float | None = None, min_gain: float = 0.03,
                  max_candidates: int = 16, rebalance: bool = False,
                  microbatch_upper: int | Sequence[int] | None = None,
                  healthy_counts: Sequence[int] | None = None) -> TopologyPlan:
    """Score node permutations of a job and choose the one to restart with (FALCON's S3).

    Args:
        layout: The job's DP/PP/TP sizes (``cp`` must be 1).
        placement: Node of each rank now (default: the layout's ``rank // ranks_per_node``).
        slow_ranks: Measured compute slowdown per rank now (2.5: the rank's GPU takes 2.5x as long).
            The slowness stays with the GPU slot when ranks move.
        slow_links: Bandwidth share left on a congested link (0.1: a tenth): a node index for its NIC (all its
            inter-node traffic), a pair ``(a, b)`` for the path between two nodes.
        params: The traffic and time model (defaults: :class:`PlacementParams`).
        iteration_s: The measured iteration time now; when given the model is calibrated on it
            (:meth:`PlacementModel.calibrate`), so predictions are in the job's own seconds.
        healthy_s: The measured iteration time before anything was slow; when given the model is calibrated
            on it instead, with no slowness on the current placement (a pace measured over the healthy
            stretch is steadier than one measured since the onset, and the traffic model then predicts the
            slow placement as well as the moves). With `slow_ranks` and `iteration_s` too, both are used
            (:func:`fit_slowness`): the healthy pace fixes the healthy compute, and the slow ranks' factors
            are scaled together until the current placement predicts `iteration_s`. A move that loads the
            healthy replicas (a split after a consolidation) is then priced at the healthy speed, not at a
            speed inferred from the slow pace. Without a consistent fit (the pace no slower than the healthy
            one under these suspects) the model is calibrated on `iteration_s` alone.
        healthy_counts: The split the healthy pace was measured under (default: the current one).
        min_gain: Smallest relative gain over the current placement worth a move.
        max_candidates: Most candidates listed (the chosen one is always among them).
        rebalance: Score every placement, the current one included, under its own best micro-batch split of
            the same total (the move followed by S2); each candidate then carries its split (``counts``) and
            a move must beat S2 alone on the current placement. Calibration still fits the current split.
        microbatch_upper: With `rebalance`, most micro-batches a replica may take (memory): one bound for all
            or one per replica.

    Returns:
        The plan: the candidates best first, the chosen one or None with the reason.

    Raises:
        InputError: invalid layout, placement, slowness, parameters, upper bounds or `min_gain` outside
            [0, 1).
    """
    if isinstance(min_gain, bool) or not isinstance(min_gain, int | float) or not 0 <= min_gain < 1:
        raise InputError(f"topology plan: min_gain must be in [0, 1), got {min_gain!r}")
    if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
        raise InputError(f"topology plan: max_candidates must be a positive integer, got {max_candidates!r}")
    calibrate_to = iteration_s  # the pace the model is scaled to, unless the healthy pace calibrates it
    if healthy_s is not None:
        healthy = _calibrate_healthy(layout, placement, params, healthy_s, healthy_counts)
        fitted = fit_slowness(layout, placement, slow_ranks, slow_links, healthy, iteration_s) \
            if iteration_s is not None and slow_ranks else None
        if fitted is not None:
            params, slow_ranks, calibrate_to = healthy, fitted, None
        elif iteration_s is None or not slow_ranks:
            params, calibrate_to = healthy, None
        # else no fit: the pace is not the healthy one plus these suspects, calibrate on the pace alone
    model = PlacementModel(layout, placement, slow_ranks=slow_ranks, slow_links=slow_links, params=params,
                           rebalance=rebalance, microbatch_upper=microbatch_upper)
    if calibrate_to is not None:
        model = model.calibrate(calibrate_to)
    current = model.time()
    as_is_s = model.with_rebalance(False).time().total_s if model.rebalance else None
    generated = link_moves(model) + consolidations(model)
    if model.n_nodes <= EXHAUSTIVE_MAX_NODES:
        method = f"exhaustive ({math.factorial(model.n_nodes)} placements)"
        everything = all_permutations(model.n_nodes)
        i, _ = best_of(model, everything)
        search = everything[i]
        evaluated = len(everything)
    else:
        starts = [model.identity]
        if generated:
            gen = np.stack([s for s, _ in generated])
            starts.append(gen[best_of(model, gen)[0]])
        search, evaluated = local_search(model, starts)
        method = "local-search"
    pool: dict[tuple[int, ...], tuple[IntArray, str, str]] = {}
    for sigma, why in [(search, "best of the search"), *generated]:
        key = tuple(int(x) for x in sigma)
        if key != tuple(range(model.n_nodes)) and key not in pool:
            pool[key] = (sigma, why, "search" if why == "best of the search" else why.split(":")[0].split()[0])
    cands: list[PlacementCandidate] = []
    if pool:
        sigmas = np.stack([v[0] for v in pool.values()])
        times = model.times(sigmas)
        for (sigma, why, source), t in zip(pool.values(), times, strict=True):
            moved = tuple(int(x) for x in np.flatnonzero(sigma != model.identity))
            where = model.describe(sigma)
            cands.append(PlacementCandidate(placement=model.placement_of(sigma), predicted_s=float(t),
                                            why=f"{why}: {where}" if where else why,
                                            source="link" if source == "link" else source, moved=moved))
    # exact ties: fewer moved nodes first, then the search's pick (it also weighed edge stages)
    cands.sort(key=lambda c: (round(c.predicted_s, 12), len(c.moved), c.source != "search", c.placement))
    listed = cands[:max_candidates]
    if model.rebalance:  # the exact split of each listed placement (the search scored it on the makespan)
        listed = [replace(c, counts=model.split(model.sigma_of(c.placement)).counts) for c in listed]
    best = listed[0] if listed else None
    now_s = current.total_s
    # with rebalance, "now" is the current placement with its best split: what S2 alone would reach
    now = (f"{now_s:.3f} s with S2 alone (current placement, best split {list(current.counts or ())}; "
           f"{as_is_s:.3f} s as is)" if as_is_s is not None else f"{now_s:.3f} s now")
    split = f" with micro-batches {list(best.counts)}" if best is not None and best.counts is not None else ""
    if best is None:
        chosen = None
        if model.n_nodes == 1:
            reason = "no other placement exists (one node)"
        elif not model.suspects():
            reason = "nothing is slow: every placement predicts the same iteration time"
        else:
            reason = f"the current placement is already the best ({now})"
    elif best.predicted_s > (1.0 - min_gain) * now_s:
        chosen = None
        reason = (f"no placement beats the current one by {min_gain:.0%}: best {best.predicted_s:.3f} s{split} "
                  f"vs {now} ({1 - best.predicted_s / now_s:.1%})")
    else:
        chosen = best
        reason = (f"predicted {best.predicted_s:.3f} s{split} vs {now} "
                  f"({1 - best.predicted_s / now_s:.1%} faster), moving node(s) {', '.join(map(str, best.moved))}")
    return TopologyPlan(current_s=now_s, current=current, candidates=tuple(listed), chosen=chosen, reason=reason,
                        method=method, evaluated=evaluated, min_gain=float(min_gain), params=model.params,
                        rebalance=model.rebalance, as_is_s=as_is_s)


def _calibrate_healthy(layout: Layout, placement: Sequence[int] | None, params: PlacementParams | None,
                       healthy_s: float, counts: Sequence[int] | None) -> PlacementParams:
    """`params` with the compute scale fitted to the healthy pace under the healthy split `counts`."""
    prm = PlacementParams() if params is None else params
    then = prm if counts is None else replace(prm, microbatches=tuple(int(c) for c in counts))
    fit = PlacementModel(layout, placement, params=then).calibrate(healthy_s).params
    return replace(fit, microbatches=prm.microbatches)


def fit_slowness(layout: Layout, placement: Sequence[int] | None, slow_ranks: Mapping[int, float],
                 slow_links: Mapping[LinkKey, float] | None, params: PlacementParams,
                 iteration_s: float) -> dict[int, float] | None:
    """The slow ranks' factors scaled together so that the current placement predicts `iteration_s`.

    Each factor ``f`` becomes ``1 + g (f - 1)`` with one ``g > 0`` for all (the suspects' relative slowness
    as measured, their size fitted), found by bisection: the model's time rises with ``g``. `params` carry the
    healthy calibration. None when no ``g`` fits: the model without slowness already takes `iteration_s` or
    more, or even 1000x the factors stay below it.
    """
    if not iteration_s > 0 or not math.isfinite(iteration_s):
        raise InputError(f"topology plan: iteration time must be positive, got {iteration_s!r}")
    base = {int(r): float(f) for r, f in slow_ranks.items()}
    if not base or all(f <= 1.0 for f in base.values()):
        return None

    def scaled(g: float) -> dict[int, float]:
        return {r: 1.0 + g * max(0.0, f - 1.0) for r, f in base.items()}

    def at(g: float) -> float:
        return PlacementModel(layout, placement, slow_ranks=scaled(g), slow_links=slow_links,
                              params=params).time().total_s

    lo, hi = 0.0, 1.0
    if at(lo) >= iteration_s:
        return None
    while at(hi) < iteration_s:
        hi *= 2.0
        if hi > 1000.0:
            return None
    return scaled(bisect_rising(at, iteration_s, lo, hi, 60))


#: Compute slowdown assumed for a compute suspect whose factor the pace model cannot tell.
DEFAULT_SLOW_FACTOR: Final[float] = 2.0
#: Bandwidth share assumed left on a link suspect's NIC (the detector names the node, not the share).
DEFAULT_LINK_SHARE: Final[float] = 0.25


def suspect_slowness(layout: Layout, suspects: Sequence[Suspect], nodes: Sequence[str],
                     model: PaceModel | None = None) -> tuple[dict[int, float], dict[LinkKey, float]]:
    """The detector's suspects as `plan_topology`'s ``slow_ranks`` and ``slow_links``.

    A compute suspect's factor is its cell's time per micro-batch in the pace model over the median of the same
    stage in the other replicas (of the other stages with one replica), at least 1; without a usable model it
    is :data:`DEFAULT_SLOW_FACTOR`. A link suspect's node (by name, an index into `nodes`) gets
    :data:`DEFAULT_LINK_SHARE` of its NIC. Suspects outside the job are left out.
    """
    slow_ranks: dict[int, float] = {}
    slow_links: dict[LinkKey, float] = {}
    per_mb = model.per_mb if model is not None and model.per_mb.shape == (layout.dp, layout.pp) else None
    for s in suspects:
        try:  # a rank from alert labels may arrive as text
            rank = None if s.rank is None or isinstance(s.rank, bool) else int(s.rank)
        except (TypeError, ValueError):
            rank = None
        if s.kind == "compute" and rank is not None and 0 <= rank < layout.world_size:
            c = layout.coords(rank)
            factor = DEFAULT_SLOW_FACTOR
            if per_mb is not None:
                peers = np.delete(per_mb[:, c.pp], c.dp) if layout.dp > 1 else np.delete(per_mb[c.dp], c.pp)
                ref = float(np.median(peers)) if peers.size else 0.0
                if ref > 0 and math.isfinite(ref):
                    factor = max(1.0, float(per_mb[c.dp, c.pp]) / ref)
            slow_ranks[rank] = max(factor, slow_ranks.get(rank, 1.0))
        elif s.kind == "link" and s.node in nodes:
            slow_links[list(nodes).index(s.node)] = DEFAULT_LINK_SHARE
    return slow_ranks, slow_links
