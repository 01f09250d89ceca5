"""The contract between the remediator and a training framework: what an adapter is told and what it answers.

An adapter is the remediator's hand on one training job. The planner only plans strategies the job's
adapter lists in :meth:`TrainingAdapter.capabilities`; the service calls :meth:`TrainingAdapter.execute`
in a worker thread (calls may block for minutes: a restart waits for the job to run again) and records the
:class:`ActionOutcome`, whose measured cost (pause, iterations lost) feeds the planner's ski-rental
thresholds for later events.

Strategies and their parameters (``ActionRequest.params``):

* ``validate`` — ``{"ranks": [int], "nodes": [str]}``: confirm suspects with a short benchmark; the outcome's
  ``result`` says ``{"confirmed": bool, "ranks": [confirmed ranks], "nodes": [confirmed nodes]}`` and may add
  ``"paths": [[node a, node b, bandwidth share left]]`` (slow paths between nodes it did not convict);
* ``rebalance`` — ``{"counts": [int]}``: micro-batches per DP replica from the next iteration boundary,
  the total unchanged;
* ``topology`` — ``{"placement": [int]}``: restart with a new rank-to-node placement (node of each rank),
  with ``"counts"`` (and ``"from"``) when the placement was scored with another split;
* ``restart`` — ``{"exclude_nodes": [str], "exclude_ranks": [int]}``: checkpoint-restart without the bad
  nodes (onto spares where the framework has them, else drain and requeue); with ``"counts"`` (and
  ``"from"``) when the remediator had changed the job's split: the job's own split to resume with, the
  slow node gone (a requeued job that starts from its own configuration has it anyway).

Idempotency: ``ActionRequest.id`` is unique per action and stable across remediator restarts. Adapters
whose target can carry an idempotency key use it (the testbed's request files are named by it), so that
:meth:`TrainingAdapter.recover` can find out what became of an action the remediator was killed in the
middle of, instead of running it again.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

STRATEGY_NAMES: tuple[str, ...] = ("validate", "rebalance", "topology", "restart")


class AdapterError(RuntimeError):
    """The adapter could not act. ``transient`` errors may succeed on a later try (target busy, timeout);
    permanent ones (job unknown, action refused) will not."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ConfigError(ValueError):
    """An adapter's options are unusable (missing key, wrong type): raised when the config is loaded."""


@dataclass(frozen=True)
class ActionRequest:
    """One action the remediator wants done.

    Attributes:
        id: The remediator's action id (unique, stable across restarts).
        job: The training job (the ``job`` label of its series and alerts).
        strategy: One of :data:`STRATEGY_NAMES`.
        params: Strategy parameters (see the module docstring).
        reason: One line for people (logged by the target where it can take one, e.g. a drain reason).
        labels: Labels of the alert that opened the event (may carry scheduler ids such as a Slurm job id).
    """

    id: str
    job: str
    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ActionOutcome:
    """What an action did, as measured by the adapter.

    Attributes:
        ok: Whether the target accepted and carried out the action.
        detail: One line for people.
        result: Adapter-specific facts (new counts, new placement, requeued job id, resumed iteration).
        pause_s: Training time lost while the job did not progress because of the action (None: unknown).
        iterations_lost: Iterations recomputed after the action (work since the last checkpoint; None: unknown).
    """

    ok: bool
    detail: str
    result: dict[str, Any] = field(default_factory=dict)
    pause_s: float | None = None
    iterations_lost: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The outcome as stored in the action and the audit."""
        return {"ok": self.ok, "detail": self.detail, "result": self.result, "pause_s": self.pause_s,
                "iterations_lost": self.iterations_lost}


@dataclass
class JobInfo:
    """What the adapter knows of the job's shape; every field may be unknown (None / empty).

    Attributes:
        layout: ``{"dp", "pp", "tp", "ranks_per_node"}`` when known.
        placement: Node index of each global rank (index into ``nodes``).
        nodes: Names of the nodes the job runs on (as the ``node`` label of its series names them, or by
            their index in this list when the launcher numbers nodes: ``FAILSLOW_NODE_ID``, ``SLURM_NODEID``).
        spare_nodes: Idle nodes a restart may move ranks to; None when the adapter does not know them
            (a scheduler's requeue finds nodes itself), an empty list when there is none.
        microbatches: Micro-batches per DP replica per iteration, as the job runs now.
        traffic: Bytes the job moves, when the adapter knows them: ``grad_bytes`` (per pipeline stage, or one
            number) and ``p2p_bytes`` (per micro-batch across a pipeline hop), the S3 planner's traffic
            model (:class:`failslow.plan.placement.PlacementParams`); its defaults otherwise.
        costs: What each strategy is expected to cost this job (seconds of lost training, by strategy name),
            from what the adapter measured of the job itself, before the remediator measured an action of
            it on this cluster: the planner uses it over its defaults and under the config file's ``costs:``.
        extra: Anything else worth showing (scheduler job id, run directory, ...).
    """

    layout: dict[str, int | None] | None = None
    placement: list[int] | None = None
    nodes: list[str] = field(default_factory=list)
    spare_nodes: list[str] | None = None
    microbatches: list[int] | None = None
    traffic: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (stored with the event, shown on the status page)."""
        return {"layout": self.layout, "placement": self.placement, "nodes": self.nodes,
                "spare_nodes": self.spare_nodes, "microbatches": self.microbatches, "traffic": self.traffic,
                "costs": self.costs, "extra": self.extra}


@runtime_checkable
class TrainingAdapter(Protocol):
    """The knobs the remediator turns on one running training job (one instance per job)."""

    kind: ClassVar[str]

    def capabilities(self) -> frozenset[str]:
        """The strategies this adapter can carry out for its job (a subset of :data:`STRATEGY_NAMES`)."""
        ...

    def info(self) -> JobInfo:
        """The job's current shape (layout, placement, micro-batch counts); raises AdapterError if unreachable."""
        ...

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Carry out one action and return what it did; blocks until done (runs in a worker thread).

        Raises:
            AdapterError: the action could not be carried out (``transient`` when a retry may work).
        """
        ...

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """After a remediator restart: the outcome of `request` if the target can tell (None: unknown).

        Never carries the action out again.
        """
        ...


_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def render(template: str, job: str, labels: Mapping[str, str] | None = None, **extra: Any) -> str:
    """Fill ``{job}``, ``{<label>}`` and ``{<extra>}`` fields of an option string.

    Only plain field names are allowed (no attribute or index access), so a template from a config file
    cannot reach into Python objects.

    Raises:
        ConfigError: a field that is neither ``job``, a label nor an extra value, or a malformed template.
    """
    values: dict[str, Any] = {**(labels or {}), **extra, "job": job}
    out: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"template {template!r}: {exc}") from None
    for literal, name, spec, conv in parsed:
        out.append(literal)
        if name is None:
            continue
        if not _FIELD.match(name) or conv or spec:
            raise ConfigError(f"template {template!r}: only plain fields like {{job}} are allowed, got {{{name}}}")
        if name not in values:
            raise ConfigError(f"template {template!r}: no value for {{{name}}} (known: {sorted(values)})")
        out.append(str(values[name]))
    return "".join(out)


def strategy_costs(value: Any) -> dict[str, float] | None:
    """`value` as ``JobInfo.costs`` (strategy name -> seconds, finite and >= 0), or None when it is not one."""
    if not isinstance(value, Mapping) or set(value) - set(STRATEGY_NAMES):
        return None
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            return None
        out[str(k)] = float(v)
    return out


def option(options: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """One adapter option, type-checked; `default` omitted means required.

    Raises:
        ConfigError: missing required option or wrong type.
    """
    if key not in options:
        if default is ...:
            raise ConfigError(f"option {key!r} is required")
        return default
    value = options[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ConfigError(f"option {key!r} must be {kind}, got a boolean")
    if not isinstance(value, kind):
        raise ConfigError(f"option {key!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value
