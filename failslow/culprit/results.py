"""What a culprit analysis returns: the suspects (:class:`Culprit`) and the per-group/per-rank tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        ratio: ``outside_s`` over the median of its peers' (NaN without peers), both at their group's mean
            share of the micro-batches when the shares are known (see ``work_share``).
        work_share: The rank's micro-batches over its data-parallel group's mean, told by its pipeline
            sends and receives (NaN: not known, e.g. no pipeline; ``outside_s`` is then compared as is).
    """

    rank: int
    comm_s: float
    outside_s: float
    wait_s: float
    caused_s: float
    last_fraction: float
    ratio: float
    work_share: float = float("nan")


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
