"""What the ski-rental planner (:mod:`failslow.plan.policy`) is told about one event, plain data.

The detector's suspects, the event with its actions so far, what the service measured of the job, the
placements the S3 planner scored; and :func:`signature`, what makes two actions "the same action".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from failslow.plan.pace import PaceModel


@dataclass(frozen=True)
class Suspect:
    """A culprit the detector named: a rank's compute or a node's links."""

    kind: str  # "compute" | "link"
    rank: int | None = None
    node: str = ""


@dataclass(frozen=True)
class PastAction:
    """What the planner needs to know of an earlier action of the event."""

    strategy: str
    state: str
    dry_run: bool = False
    ended_at: float | None = None
    effective: bool | None = None  # None until judged
    params: Mapping[str, Any] = field(default_factory=dict)
    pace_before_s: float | None = None  # the job's pace when the action was decided
    pace_after_s: float | None = None  # measured once judged (None until then)

    @property
    def key(self) -> str:
        """The action's identity for "not the same action again" (see :func:`signature`)."""
        return signature(self.strategy, self.params)


def signature(strategy: str, params: Mapping[str, Any]) -> str:
    """What makes two actions "the same action": the strategy and what it changes.

    A split that did not help is not applied again, but another split may be; the same for a placement and
    for the set of nodes a restart excludes.
    """
    if strategy == "rebalance":
        what: Any = list(params.get("counts") or [])
    elif strategy == "topology":
        what = list(params.get("placement") or [])
    elif strategy == "restart":
        what = sorted(params.get("exclude_nodes") or [])
    else:
        what = [sorted(params.get("ranks") or []), sorted(params.get("nodes") or [])]
    return f"{strategy}:{what}"


@dataclass(frozen=True)
class EventView:
    """One open fail-slow event as the planner sees it.

    Attributes:
        job: The training job.
        onset_ts: Unix time of the first slow iteration (the detector's onset).
        firing: Whether Alertmanager still reports the alert firing (resolved: no new action starts).
        suspects: Culprits named so far.
        lost_s: Training time lost to the slowdown since onset (seconds of progress).
        validated: None before validation, else whether it confirmed the suspects.
        cleared: Nodes a link validation measured healthy (a congested path between two of them is S3's
            business): a restart does not exclude them.
        actions: The event's actions so far, oldest first.
    """

    job: str
    onset_ts: float
    firing: bool = True
    suspects: tuple[Suspect, ...] = ()
    lost_s: float = 0.0
    validated: bool | None = None
    cleared: frozenset[str] = frozenset()
    actions: tuple[PastAction, ...] = ()


@dataclass(frozen=True)
class TopologyOption:
    """A placement the S3 planner scored: node of each rank and its predicted iteration time.

    `counts`, when set, is the micro-batch split per DP replica the prediction assumes (the planner scored the
    placement under its own best split): the move pays only with that split applied at the restart.
    """

    placement: tuple[int, ...]
    predicted_s: float
    why: str = ""
    counts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class JobView:
    """What the service measured of the job for this decision.

    Attributes:
        now: Unix time of the decision.
        pace_s: Current iteration time (None: unknown, e.g. no fresh series).
        healthy_s: Iteration time before onset (None: unknown).
        model: Calibrated pace model (None: no per-rank compute times).
        microbatches: Micro-batches per DP replica now (None: unknown).
        default_microbatches: The job's own split, where the remediator changed it (None: unknown or
            unchanged). A restart that leaves the slow node behind goes back to it.
        microbatch_upper: Per-replica upper bounds (memory), or None.
        placement: Node index of each rank (into `nodes`), or None.
        nodes: Names of the job's nodes.
        spares: Free spare nodes a restart may move ranks to (None: unknown, e.g. a scheduler's requeue finds
            nodes itself).
        capabilities: Strategies the job's adapter supports.
        ineffective: Signatures (:func:`signature`) of actions that did not help this job recently (not taken
            again).
        actions_last_hour: Actions (not dry-run plans) of the job started in the last hour.
        topology: S3 candidates scored by the topology planner (best first), if any.
        settling: Why the measured pace does not show the job's latest action yet (the exporters' readings are
            means over their last iterations, some of them from before it); None: it does. Its effect is not
            judged and no new action is planned meanwhile.
    """

    now: float
    pace_s: float | None = None
    healthy_s: float | None = None
    model: PaceModel | None = None
    microbatches: tuple[int, ...] | None = None
    default_microbatches: tuple[int, ...] | None = None
    microbatch_upper: int | tuple[int, ...] | None = None
    placement: tuple[int, ...] | None = None
    nodes: tuple[str, ...] = ()
    spares: int | None = None
    capabilities: frozenset[str] = frozenset()
    ineffective: frozenset[str] = frozenset()
    actions_last_hour: int = 0
    topology: tuple[TopologyOption, ...] = ()
    settling: str | None = None
