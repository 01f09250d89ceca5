"""The ski-rental planner: which mitigation pays off now for one fail-slow event (pure).

FALCON's adaptive multi-level mitigation (its Algorithm 1) treats a fail-slow like ski rental: ignoring it
(S1) costs a little every second it lasts, each fix costs once. It escalates from S1 to micro-batch
redistribution (S2), topology adjustment (S3) and checkpoint-restart (S4) when the slowdown accumulated
since onset reaches the next strategy's cost, which bounds the loss at twice the best action in hindsight.
We keep that rule and add what acting on real jobs needs:

* **prediction gate** — every candidate comes with the iteration time it should leave the job with
  (:mod:`failslow.plan.pace` for S2, the healthy pace for S4, the S3 planner's score for S3). The action is
  taken only when the predicted saving over the expected remaining duration beats its cost, where the
  remaining duration is estimated as the time the event has lasted so far (the older a fail-slow, the longer
  it is likely to last), and never below ``horizon_min_s``;
* **applicability** — by culprit kind (compute → S2, S3 consolidation; link → S3; both → S3; S4 last), by
  what the job's adapter supports, and never a strategy that did not help this job before;
* **validation** — before an expensive strategy (S3, S4) the suspects are confirmed when the adapter can;
* **safety** — one action in flight per job, a cooldown before its effect is judged, a cap on actions per
  hour, and approval for the strategies that need it.

Every input is plain data, the clock included, so each transition is a unit test. The service owns the
state; this module only answers "what now, and why". What it is told (the suspects, the event, the job, the S3
options) is defined in :mod:`failslow.plan.policy_views` and importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from failslow.errors import InputError
from failslow.plan.microbatch import rebalance
from failslow.plan.policy_views import EventView, JobView, PastAction, Suspect, TopologyOption, signature

__all__: list[str] = [
    "ACTION_STATES", "DECISIONS", "IN_FLIGHT", "LEVEL", "STRATEGIES", "Candidate", "Costs", "Decision", "EventView",
    "JobView", "PastAction", "Policy", "Strategy", "Suspect", "TopologyOption", "accrue", "bad_nodes", "candidate",
    "decide", "judge", "ladder", "recovered", "restore", "signature", "validation_targets", "verdict_for"]

Strategy = Literal["validate", "rebalance", "topology", "restart"]

#: Strategy names, the same everywhere (API, metric labels, audit, docs).
STRATEGIES: tuple[str, ...] = ("validate", "rebalance", "topology", "restart")
#: What a decision can say: ignore (S1) or one of the strategies.
DECISIONS: tuple[str, ...] = ("ignore", *STRATEGIES)
#: FALCON's level of each decision (validation confirms suspects, it is no level of its own).
LEVEL: dict[str, int] = {"ignore": 1, "validate": 1, "rebalance": 2, "topology": 3, "restart": 4}
#: Action states; the first three are "in flight".
ACTION_STATES: tuple[str, ...] = ("planned", "pending_approval", "running", "succeeded", "failed", "rejected")
IN_FLIGHT: frozenset[str] = frozenset({"planned", "pending_approval", "running"})


@dataclass(frozen=True)
class Costs:
    """Training time each strategy costs, in seconds of lost progress (pause plus work redone).

    The defaults stand for a GPU cluster before anything was measured on it: a validation pauses the job for
    seconds, a split applies at an iteration boundary, a checkpoint-restart costs minutes at scale (saving and
    loading the checkpoint, communicator set-up). The service stacks, each over the one before
    (:meth:`layered`): these defaults, what the job's adapter expects from its own measurements of the job
    (the testbed's start-up time), the config file's ``costs:``, and the cost the adapter measured the last
    times the strategy ran (a running average per adapter and strategy); docs/remediator.md.
    """

    validate: float = 10.0
    rebalance: float = 2.0
    topology: float = 90.0
    restart: float = 120.0

    def of(self, strategy: str) -> float:
        """Cost of one strategy."""
        if strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {strategy!r}")
        return float(getattr(self, strategy))

    def with_measured(self, measured: Mapping[str, float]) -> Costs:
        """These costs with measured ones (by strategy name) put in their place."""
        known = {k: max(0.0, float(v)) for k, v in measured.items() if k in STRATEGIES and math.isfinite(v)}
        return replace(self, **known)

    def layered(self, configured: Iterable[str], expected: Mapping[str, float],
                measured: Mapping[str, float]) -> Costs:
        """The cost of each strategy from the most specific source that has one.

        Args:
            configured: The strategies whose cost in `self` a person set (the config file's ``costs:``); the
                others hold the built-in defaults.
            expected: The adapter's estimate for this job before anything was measured (by strategy name).
            measured: Costs measured on this cluster (by strategy name); they win over everything.
        """
        given = set(configured)
        base = Costs().with_measured(expected)
        own = {k: self.of(k) for k in STRATEGIES if k in given}
        return base.with_measured(own).with_measured(measured)


@dataclass(frozen=True)
class Policy:
    """The planner's knobs (config file ``policy:``; docs/remediator.md).

    Attributes:
        cooldown_s: After an action ends, wait at least this long before judging its effect or acting again
            (and until the measured pace shows it: `JobView.settling`).
        max_actions_per_hour: Actions (not dry-run plans, not validations) per job per rolling hour.
        min_gain: Smallest predicted relative speed-up worth an action.
        effective_share: An action is effective when it took back at least this share of the slowdown it
            was predicted to take back (and at least ``min_gain`` of the pace).
        recovered_ratio: Pace within this factor of the healthy pace counts as recovered.
        horizon_min_s: The expected remaining duration of an event is at least this.
        approval: Strategies that wait for a person's approval before they run.
        validate_before: Strategies whose suspects are validated first (when the adapter can).
        retune_gain: Smallest predicted speed-up for a further split once one was applied in the event: the
            per-replica times are measured with noise, and two near-equal splits must not take turns.
    """

    cooldown_s: float = 60.0
    max_actions_per_hour: int = 4
    min_gain: float = 0.05
    effective_share: float = 0.3
    recovered_ratio: float = 1.1
    horizon_min_s: float = 60.0
    approval: frozenset[str] = frozenset({"restart"})
    validate_before: frozenset[str] = frozenset({"topology", "restart"})
    retune_gain: float = 0.10

    def __post_init__(self) -> None:
        for name in ("cooldown_s", "horizon_min_s"):
            if not getattr(self, name) >= 0:
                raise InputError(f"policy {name} must be >= 0")
        if self.max_actions_per_hour < 0:
            raise InputError("policy max_actions_per_hour must be >= 0")
        if not 0 <= self.min_gain < 1 or not 0 <= self.retune_gain < 1 or not 0 <= self.effective_share <= 1:
            raise InputError("policy min_gain and retune_gain must be in [0, 1) and effective_share in [0, 1]")
        if not self.recovered_ratio >= 1:
            raise InputError("policy recovered_ratio must be >= 1")
        bad = (set(self.approval) | set(self.validate_before)) - set(STRATEGIES)
        if bad:
            raise InputError(f"policy names unknown strategies {sorted(bad)}")


@dataclass(frozen=True)
class Candidate:
    """One strategy the planner weighed, with its parameters, prediction and verdict."""

    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    predicted_s: float | None = None
    cost_s: float = 0.0
    saving_s: float | None = None
    ok: bool = False
    why: str = ""
    formed: bool = False  # the parameters are complete: the strategy could be carried out as it stands

    def to_json(self) -> dict[str, Any]:
        """JSON form for the audit and the API."""
        return {"strategy": self.strategy, "params": self.params, "predicted_s": self.predicted_s,
                "cost_s": self.cost_s, "saving_s": self.saving_s, "ok": self.ok, "why": self.why}


@dataclass(frozen=True)
class Decision:
    """The planner's answer: a strategy to run (or ignore), why, and every candidate it weighed."""

    strategy: str
    reason: str
    chosen: Candidate | None = None
    considered: tuple[Candidate, ...] = ()
    needs_approval: bool = False
    wait: bool = False  # ignore for now because of a rule (in flight, cooldown, cap), not because nothing pays

    @property
    def level(self) -> int:
        """FALCON's level of this decision."""
        return LEVEL[self.strategy]

    def to_json(self) -> dict[str, Any]:
        """JSON form for the audit and the API."""
        return {"strategy": self.strategy, "reason": self.reason,
                "chosen": None if self.chosen is None else self.chosen.to_json(),
                "considered": [c.to_json() for c in self.considered], "needs_approval": self.needs_approval,
                "wait": self.wait}


def accrue(lost_s: float, since: float, now: float, pace_s: float | None, healthy_s: float | None) -> float:
    """Slowdown accumulated from `since` to `now` added to `lost_s` (seconds of training progress).

    A job at pace ``T`` whose healthy pace is ``T0`` makes progress at ``T0 / T`` of the healthy rate, so it
    loses ``1 - T0 / T`` of every wall-clock second. Unknown paces add nothing (no evidence of a loss).
    """
    if pace_s is None or healthy_s is None or not (pace_s > 0 and healthy_s > 0) or now <= since:
        return lost_s
    return lost_s + (now - since) * max(0.0, 1.0 - healthy_s / pace_s)


def judge(pace_before_s: float, pace_after_s: float, predicted_s: float | None, policy: Policy) -> tuple[bool, str]:
    """Whether an action helped: it took back enough of the slowdown it was predicted to take back.

    Returns:
        (effective, one line saying why).
    """
    gain = pace_before_s - pace_after_s
    need = policy.min_gain * pace_before_s
    if predicted_s is not None and predicted_s < pace_before_s:
        need = max(need, policy.effective_share * (pace_before_s - predicted_s))
    eff = gain >= need
    pred = "" if predicted_s is None else f", predicted {predicted_s:.3f} s"
    return eff, (f"pace {pace_before_s:.3f} s -> {pace_after_s:.3f} s{pred}: "
                 f"{'effective' if eff else 'ineffective'} (gain {gain:.3f} s, needed {need:.3f} s)")


def recovered(pace_s: float | None, healthy_s: float | None, policy: Policy) -> bool:
    """Whether the job's pace is back within ``recovered_ratio`` of its healthy pace."""
    return pace_s is not None and healthy_s is not None and pace_s <= policy.recovered_ratio * healthy_s


def ladder(suspects: Sequence[Suspect]) -> tuple[str, ...]:
    """Applicable strategies by culprit kind, cheapest first (FALCON: compute → S2, S3; link → S3; S4 last).

    Without a named suspect only S2 applies: the measured replica times may still show who is slow, and
    there is no node to move away from.
    """
    kinds = {s.kind for s in suspects}
    if "link" in kinds:
        return ("topology", "restart")
    if "compute" in kinds:
        return ("rebalance", "topology", "restart")
    return ("rebalance",)


def bad_nodes(suspects: Sequence[Suspect], placement: Sequence[int] | None, nodes: Sequence[str]) -> list[str]:
    """Names of the nodes the suspects sit on (a rank's node from the placement when it is known)."""
    out: list[str] = []
    for s in suspects:
        name = s.node
        if s.rank is not None and placement is not None and 0 <= s.rank < len(placement) \
                and 0 <= placement[s.rank] < len(nodes):
            name = nodes[placement[s.rank]]
        if name and name not in out:
            out.append(name)
    return out


def _gate(c: Candidate, pace: float | None, healthy: float | None, remaining_s: float, policy: Policy,
          check_cost: bool = True) -> Candidate:
    """Fill in the saving and the verdict of a candidate with a prediction."""
    if c.predicted_s is None or pace is None:
        return replace(c, ok=False, why=c.why or "no prediction (pace unknown)")
    ref = healthy if healthy is not None else pace
    # progress gained per wall second going forward, times the time it should last
    saving = remaining_s * max(0.0, ref / c.predicted_s - ref / pace)
    gain = 1.0 - c.predicted_s / pace
    if gain < policy.min_gain:
        return replace(c, saving_s=saving, ok=False,
                       why=f"predicted {c.predicted_s:.3f} s vs {pace:.3f} s now: gain {gain:.1%} < {policy.min_gain:.0%}")
    if not check_cost:
        return replace(c, saving_s=saving, ok=True,
                       why=f"predicted {c.predicted_s:.3f} s vs {pace:.3f} s now, saving {saving:.1f} s "
                           f"(cost {c.cost_s:.1f} s not weighed)")
    if saving <= c.cost_s:
        return replace(c, saving_s=saving, ok=False,
                       why=f"predicted saving {saving:.1f} s over {remaining_s:.0f} s <= cost {c.cost_s:.1f} s")
    return replace(c, saving_s=saving, ok=True,
                   why=f"predicted {c.predicted_s:.3f} s vs {pace:.3f} s now, saving {saving:.1f} s > cost {c.cost_s:.1f} s")


def moved_since_validation(actions: Sequence[PastAction]) -> bool:
    """Whether a placement change (S3 or S4) ended after the event's last validation that ended."""
    def last(strategies: tuple[str, ...]) -> float | None:
        ends = [a.ended_at for a in actions if a.strategy in strategies and a.state == "succeeded"
                and not a.dry_run and a.ended_at is not None]
        return max(ends) if ends else None

    moved, checked = last(("topology", "restart")), last(("validate",))
    return moved is not None and (checked is None or checked < moved)


def validation_targets(suspects: Sequence[Suspect]) -> dict[str, list[Any]]:
    """What a validation of `suspects` measures: the compute of the suspect ranks, the links of the link
    suspects' nodes."""
    return {"ranks": sorted({s.rank for s in suspects if s.rank is not None}),
            "nodes": sorted({s.node for s in suspects if s.kind == "link" and s.node})}


def verdict_for(validated: bool | None, checked: Mapping[str, Any] | None, suspects: Sequence[Suspect]) -> bool | None:
    """A validation's verdict while it still covers the suspects: None (validate again) once the detector names
    a rank or node the validation did not measure (`checked`: its targets; None: unknown, the verdict stands)."""
    if validated is None or checked is None:
        return validated
    now = validation_targets(suspects)
    covered = set(now["ranks"]) <= set(checked.get("ranks") or []) and \
        set(now["nodes"]) <= set(checked.get("nodes") or [])
    return validated if covered else None


def candidate(strategy: str, event: EventView, job: JobView, costs: Costs) -> Candidate:
    """One strategy's parameters and predicted iteration time for this event (ok is decided by the gate).

    A candidate that cannot be formed (no model, nothing to exclude, ...) comes back with ``predicted_s``
    None and ``why`` saying what is missing.
    """
    cost = costs.of(strategy)
    if strategy == "rebalance":
        if job.model is None or job.microbatches is None:
            return Candidate(strategy, cost_s=cost, why="no per-rank compute times or micro-batch counts")
        total = sum(job.microbatches)
        try:
            split = rebalance(job.model.times, total, 1, job.microbatch_upper, offsets=job.model.offsets)
        except InputError as exc:
            return Candidate(strategy, cost_s=cost, why=f"no split: {exc}")
        counts = [int(x) for x in split.counts]
        if tuple(counts) == tuple(job.microbatches):
            return Candidate(strategy, {"counts": counts}, cost_s=cost, why="the current split is already optimal")
        return Candidate(strategy, {"counts": counts, "from": list(job.microbatches)},
                         predicted_s=job.model.predict(counts), cost_s=cost, formed=True)
    if strategy == "topology":
        if not job.topology:
            return Candidate(strategy, cost_s=cost, why="no placement scored better than the current one")
        best = min(job.topology, key=lambda o: o.predicted_s)
        params: dict[str, Any] = {"placement": list(best.placement), "why": best.why}
        if best.counts is not None and tuple(best.counts) != tuple(job.microbatches or ()):
            # the move pays with this split applied at the restart
            params["counts"] = [int(c) for c in best.counts]
            if job.microbatches is not None:
                params["from"] = list(job.microbatches)
        return Candidate(strategy, params, predicted_s=best.predicted_s, cost_s=cost, formed=True)
    if strategy == "restart":
        exclude = [n for n in bad_nodes(event.suspects, job.placement, job.nodes) if n not in event.cleared]
        if not exclude:
            return Candidate(strategy, cost_s=cost,
                             why="no suspect node to exclude" + (" (validation cleared them)" if event.cleared else ""))
        ranks = sorted({s.rank for s in event.suspects if s.rank is not None})
        params = {"exclude_nodes": exclude, "exclude_ranks": ranks}
        if job.default_microbatches is not None and job.microbatches is not None \
                and tuple(job.default_microbatches) != tuple(job.microbatches):
            # the split that worked around the slow node would hold the healthy replica back once it is gone
            params.update(counts=[int(c) for c in job.default_microbatches], **{"from": list(job.microbatches)})
        holding = [n for n in exclude if job.placement is None or n not in job.nodes
                   or job.nodes.index(n) in job.placement]
        if job.spares is not None and job.spares < len(holding):
            # the ranks left without a spare crowd the healthy nodes (or the job shrinks): not the healthy pace
            return Candidate(strategy, params, cost_s=cost, formed=True,
                             why=f"{len(holding)} node(s) to leave but {job.spares} free spare(s): "
                                 "the job would run short of nodes, its pace is not predicted")
        # Off the bad node onto a spare, with the job's own split, the job runs as it did before the onset.
        return Candidate(strategy, params,
                         predicted_s=job.healthy_s, cost_s=cost, formed=True,
                         why="" if job.healthy_s is not None else "healthy pace unknown")
    if strategy == "validate":
        targets = validation_targets(event.suspects)
        found = bool(targets["ranks"] or targets["nodes"])
        return Candidate(strategy, targets, cost_s=cost, formed=found, why="" if found else "no suspect to validate")
    raise InputError(f"unknown strategy {strategy!r}")


def decide(event: EventView, job: JobView, costs: Costs, policy: Policy, *, force: str | None = None) -> Decision:
    """What to do now about one event.

    Args:
        event: The event and its actions so far.
        job: What was measured of the job now.
        costs: The cost of each strategy on this cluster.
        policy: The planner's knobs.
        force: ``None`` for the planner's own rules; ``"auto"`` for a person asking for the planner's best
            action now (no ski-rental wait, no cooldown, still the prediction gate); a strategy name for a
            person asking for exactly that strategy (no wait, no gate, still applicability).

    Returns:
        The decision; ``ignore`` says why nothing is done now.
    """
    if force is not None and force != "auto" and force not in STRATEGIES:
        raise InputError(f"unknown action {force!r} (auto or one of {', '.join(STRATEGIES)})")
    in_flight = [a for a in event.actions if a.state in IN_FLIGHT and not a.dry_run]
    if in_flight:
        return Decision("ignore", f"{in_flight[-1].strategy} in flight ({in_flight[-1].state})", wait=True)
    ineffective = set(job.ineffective) | {a.key for a in event.actions if a.effective is False}
    if force is None:
        # validation leaves the pace as it was: nothing to wait for after it
        ended = [a.ended_at for a in event.actions
                 if a.ended_at is not None and not a.dry_run and a.strategy != "validate"]
        cooling = bool(ended) and job.now - max(ended) < policy.cooldown_s
        capped = job.actions_last_hour >= policy.max_actions_per_hour
        settling = bool(ended) and job.settling is not None
        if not event.firing:
            back = None if cooling or settling or capped else _restore_resolved(job, policy, ineffective)
            if back is not None:
                return Decision("rebalance", back.why, back, (back,))
            return Decision("ignore", "alert resolved: no new action", wait=True)
        if cooling:
            return Decision("ignore", f"cooldown: {policy.cooldown_s - (job.now - max(ended)):.0f} s left", wait=True)
        if settling:
            return Decision("ignore", f"settling: {job.settling}", wait=True)
        if capped:
            return Decision("ignore", f"cap: {job.actions_last_hour} actions in the last hour", wait=True)

    if event.validated is not None and moved_since_validation(event.actions):
        # the verdict was measured on the placement before a move: the suspects may sit elsewhere now (after
        # an S4 the suspect rank runs on the spare), so what it confirmed is confirmed no longer
        event = replace(event, validated=None)
    done = {a.strategy for a in event.actions if a.dry_run or a.state == "rejected"}
    applied = {a.strategy for a in event.actions if a.state == "succeeded" and not a.dry_run}
    remaining = max(job.now - event.onset_ts, policy.horizon_min_s)
    considered: list[Candidate] = []
    if force is not None and force != "auto":
        order: tuple[str, ...] = (force,)
    else:
        order = ladder(event.suspects)
    for strategy in order:
        if strategy not in job.capabilities:
            considered.append(Candidate(strategy, cost_s=costs.of(strategy),
                                        why="not supported by the job's adapter"))
            continue
        if force is None and strategy in done:
            considered.append(Candidate(strategy, cost_s=costs.of(strategy),
                                        why="already planned (dry run) or rejected in this event"))
            continue
        harmful = _harmful_split(event, policy) if strategy == "rebalance" else None
        c = candidate(strategy, event, job, costs) if harmful is None else _undo(harmful, job, costs)
        if not c.formed:
            considered.append(c)
            continue
        if force is None and signature(strategy, c.params) in ineffective:
            considered.append(replace(c, why="the same action did not help this job before"))
            continue
        if force not in (None, "auto"):  # a person asked for exactly this: no wait, no gate
            if c.predicted_s is not None:
                c = _gate(c, job.pace_s, job.healthy_s, remaining, policy, check_cost=False)
            c = replace(c, ok=True, why=f"requested; {c.why}" if c.why else "requested")
            return Decision(strategy, c.why, c, (*considered, c), needs_approval=strategy in policy.approval)
        if c.predicted_s is None:
            considered.append(c)
            continue
        if force is None and event.lost_s < c.cost_s:
            # Ski rental: keep renting until the rent paid reaches this strategy's price.
            considered.append(replace(c, why=f"accumulated slowdown {event.lost_s:.1f} s < cost {c.cost_s:.1f} s"))
            return Decision("ignore", considered[-1].why, considered=tuple(considered))
        undo_why = c.why if harmful is not None else ""
        c = _gate(c, job.pace_s, job.healthy_s, remaining, policy, check_cost=force is None)
        if undo_why:
            c = replace(c, why=f"{undo_why}; back: {c.why}")
        if c.ok and strategy == "rebalance" and "rebalance" in applied and job.pace_s and c.predicted_s \
                and harmful is None:
            gain = 1.0 - c.predicted_s / job.pace_s
            if gain < policy.retune_gain:
                c = replace(c, ok=False, why=f"a split is in place; re-tuning gain {gain:.1%} < {policy.retune_gain:.0%}")
        considered.append(c)
        if not c.ok:
            continue
        rival = _better_restart(c, order, event, job, costs, policy, remaining, done, ineffective, force)
        if rival is not None:
            considered.append(rival)
            c, strategy = rival, rival.strategy
        if (strategy in policy.validate_before and "validate" in job.capabilities and event.validated is None
                and "validate" not in done):
            return _validate(event, job, costs, f"confirm the suspects before {strategy}", considered)
        if strategy in policy.validate_before and event.validated is False:
            considered[-1] = replace(c, ok=False, why="validation cleared the suspects")
            continue
        return Decision(strategy, c.why, c, tuple(considered), needs_approval=strategy in policy.approval)
    if force in (None, "auto") and _measure_links_first(event, job, done, costs, force):
        return _validate(event, job, costs,
                         "measure the suspect links: no strategy can be planned on the detector's guess alone",
                         considered)
    why = "; ".join(f"{c.strategy}: {c.why}" for c in considered) or "no applicable strategy"
    return Decision("ignore", why, considered=tuple(considered))


def _restore_resolved(job: JobView, policy: Policy, ineffective: set[str]) -> Candidate | None:
    """The way back to the job's own split while the event waits for its pace to be confirmed back.

    The detector ends an event once the level took back most of its rise, and a split made for a straggler
    that has since recovered holds the job above its healthy pace by about that residue: the alert resolves
    with the pace not back, and the pace cannot come back while the split stays (nor the event close before
    its confirmation times out). The same rule as after the event (:func:`restore`): back when predicted
    ``min_gain`` faster, unless that split is among the `ineffective` signatures.
    """
    if "rebalance" not in job.capabilities or job.default_microbatches is None:
        return None
    back = restore(job, job.default_microbatches, policy)
    if back is None:
        return None
    if signature("rebalance", back.params) in ineffective:
        return None
    return replace(back, why=f"alert resolved with the event's split in place; {back.why}")


def _harmful_split(event: EventView, policy: Policy) -> PastAction | None:
    """The event's latest split that left the job slower than it found it (by more than ``min_gain``), since
    the job's last move (a new placement is a new job for the model)."""
    for a in reversed(event.actions):
        if a.strategy in ("topology", "restart") and a.state == "succeeded" and not a.dry_run:
            return None
        if a.strategy == "rebalance" and a.state == "succeeded" and not a.dry_run and a.pace_before_s \
                and a.pace_after_s and a.pace_after_s > (1.0 + policy.min_gain) * a.pace_before_s:
            return a
    return None


def _undo(harmful: PastAction, job: JobView, costs: Costs) -> Candidate:
    """S2 once a split made the job slower: only the way back, predicted at the pace measured before it.

    The split was chosen on the ranks' measured compute times, and the job answered the other way: those
    times do not predict how this job's pace follows its split, and another split planned on them can go the
    same way (a consolidation run went [4, 4] -> [3, 5] -> [2, 6], 0.80 -> 0.92 -> 1.01 s). The split the job
    ran before is the one whose pace was measured: back to it, and the ladder goes on to the strategies that
    do not rest on those times.
    """
    cost = costs.of("rebalance")
    why = (f"a split predicted faster left the job slower ({harmful.pace_before_s:.3f} s -> "
           f"{harmful.pace_after_s:.3f} s): the measured compute times do not predict this job's splits")
    back = [int(c) for c in harmful.params.get("from") or []]
    now = list(job.microbatches or [])
    if not back or now != [int(c) for c in harmful.params.get("counts") or []]:
        return Candidate("rebalance", cost_s=cost, why=why + "; the split it left is no longer in place")
    return Candidate("rebalance", {"counts": back, "from": now, "undo": True}, predicted_s=harmful.pace_before_s,
                     cost_s=cost, formed=True, why=why)


#: The strategies that checkpoint and restart the job (S3 with a new placement, S4 off the bad nodes).
RESTARTS: tuple[str, ...] = ("topology", "restart")


def _better_restart(c: Candidate, order: Sequence[str], event: EventView, job: JobView, costs: Costs,
                    policy: Policy, remaining_s: float, done: set[str], ineffective: set[str],
                    force: str | None) -> Candidate | None:
    """A later rung that restarts the job as `c` does and leaves more, net of its cost, or None.

    The ladder takes the first strategy that pays off, as ski rental takes the cheaper fix first. S3 and S4
    are no such pair: both are a checkpoint-restart, and which one leaves the job faster is a matter of
    prediction, not of price: with a free spare, S4 off one slow device predicts the healthy pace, while a
    consolidation keeps the device in the job. The later one is taken when it predicts the job at least
    ``min_gain`` faster than `c` (a spare is not spent on a move about as good) and its predicted saving less
    its cost is the larger, under the same rules (supported, not done, not ineffective, its cost paid by the
    slowdown so far, through the gate)."""
    if c.strategy not in RESTARTS or c.saving_s is None:
        return None
    best: Candidate | None = None
    for strategy in order[order.index(c.strategy) + 1:]:
        if strategy not in RESTARTS or strategy not in job.capabilities or (force is None and strategy in done):
            continue
        r = candidate(strategy, event, job, costs)
        if not r.formed or r.predicted_s is None:
            continue
        if force is None and (signature(strategy, r.params) in ineffective or event.lost_s < r.cost_s):
            continue
        r = _gate(r, job.pace_s, job.healthy_s, remaining_s, policy, check_cost=force is None)
        ref = best if best is not None else c
        if r.ok and r.saving_s is not None and ref.saving_s is not None and c.predicted_s is not None \
                and r.predicted_s is not None and r.predicted_s <= (1.0 - policy.min_gain) * c.predicted_s \
                and r.saving_s - r.cost_s > ref.saving_s - ref.cost_s:
            best = replace(r, why=f"{r.why}; leaves more than {c.strategy} (predicted {c.predicted_s:.3f} s, "
                                  f"saving {c.saving_s:.1f} s, cost {c.cost_s:.1f} s)")
    return best


def _validate(event: EventView, job: JobView, costs: Costs, why: str, considered: list[Candidate]) -> Decision:
    """A validation of the event's suspects now, after the candidates `considered`."""
    v = replace(candidate("validate", event, job, costs), ok=True, why=why)
    return Decision("validate", why, v, (*considered, v))


def _measure_links_first(event: EventView, job: JobView, done: set[str], costs: Costs, force: str | None) -> bool:
    """Whether to validate although no strategy was chosen: a link suspect not measured yet.

    The detector names the nodes whose traffic slowed, not which NIC or path nor how much bandwidth is left;
    the topology planner then scores a guess, and a restart would leave every named node (both ends of one
    congested path). A link validation measures exactly that, at the cost of a short pause, and the next
    decision plans on it. Ski rental as for any strategy: once the slowdown accumulated reaches its cost.
    """
    if event.validated is not None or "validate" not in job.capabilities or "validate" in done:
        return False
    if not validation_targets(event.suspects)["nodes"]:  # no link suspect with a node to measure
        return False
    return force is not None or event.lost_s >= costs.of("validate")


def restore(job: JobView, default: Sequence[int], policy: Policy) -> Candidate | None:
    """After an event: a split back to `default` when the replicas are even again and it pays.

    An uneven split chosen while a replica was slow makes the job slower once that replica recovers; the
    planner returns to the job's own split when the model predicts it at least ``min_gain`` faster.
    """
    if job.model is None or job.microbatches is None or tuple(default) == tuple(job.microbatches):
        return None
    if sum(default) != sum(job.microbatches) or job.pace_s is None:
        return None
    pred = job.model.predict(list(default))
    if pred > (1.0 - policy.min_gain) * job.pace_s:
        return None
    return Candidate("rebalance", {"counts": list(default), "from": list(job.microbatches), "restore": True},
                     predicted_s=pred, ok=True,
                     why=f"replicas even again: the job's own split predicted {pred:.3f} s vs {job.pace_s:.3f} s now")
