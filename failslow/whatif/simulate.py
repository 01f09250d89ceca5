"""Simulate step timelines on the dependency model, for many what-if scenarios at once.

An operation starts when everything it waits for has ended; a local op ends after its duration; a
communication op ends at the latest start among its group's members (across the step's DP ranks for
DP-synchronised groups) plus its own transfer duration.

The simulator walks the template's groups once in topological order and, for every node, does one
numpy operation over an array shaped `(scenarios, lanes, steps)`: every scenario, DP rank and step
is simulated together, so the Python cost is per template node, not per operation. Two lane
layouts exist:

* `FullLanes` - one lane per DP rank; a scenario keeps the original work of any subset of (node,
  DP rank) and idealises the rest.
* `OneRankLanes` - for scenarios in which only one DP rank differs from the ideal (per-DP-rank and
  per-worker decompositions): lane 0 is that rank and lane 1 stands for all others, which are
  identical because the ideal work does not depend on the rank. 1024 per-worker scenarios of a
  64-way DP job cost 2 lanes each instead of 64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from failslow.whatif.model import Model

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class WorkSource(Protocol):
    """Gives each template node's work (duration or transfer time) per scenario, lane and step."""

    @property
    def n_lanes(self) -> int:
        """Lanes per step (DP ranks, or 2 for `OneRankLanes`)."""
        ...

    def __call__(self, v: int) -> FloatArray:
        """Work of node `v`, broadcastable to (scenarios, lanes, steps)."""
        ...


@dataclass(frozen=True)
class FullLanes:
    """Scenarios over all DP ranks: `keep[s, v, d]` keeps node v's original work on DP rank d."""

    model: Model
    keep: BoolArray  # (scenarios, nodes, dp)

    @property
    def n_lanes(self) -> int:
        """One lane per DP rank."""
        return self.model.dp

    def __call__(self, v: int) -> FloatArray:
        """Original work where kept, the ideal elsewhere."""
        k = self.keep[:, v, :, None]
        return np.where(k, self.model.work[v][None], self.model.ideal[v])


@dataclass(frozen=True)
class OneRankLanes:
    """Scenarios in which DP rank `rank[s]` keeps its original work on the stages `stages[s]`."""

    model: Model
    rank: IntArray  # (scenarios,)
    stages: BoolArray  # (scenarios, pp)

    @property
    def n_lanes(self) -> int:
        """The chosen rank, plus one lane for all other (ideal) ranks when there are any."""
        return 2 if self.model.dp > 1 else 1

    def __call__(self, v: int) -> FloatArray:
        """Lane 0: original or ideal by stage; lane 1: ideal."""
        m = self.model
        n = self.rank.shape[0]
        out = np.empty((n, self.n_lanes, m.n_steps))
        sel = self.stages[:, m.stage[v]]
        out[:, 0, :] = np.where(sel[:, None], m.work[v][self.rank], m.ideal[v])
        if self.n_lanes > 1:
            out[:, 1, :] = m.ideal[v]
        return out


def simulate(model: Model, source: WorkSource, n_scenarios: int) -> FloatArray:
    """Step times (scenarios, steps) of the simulated timelines; a step starts at 0."""
    deps = model.deps
    remaining = [0] * model.n_nodes
    for v in range(model.n_nodes):
        for d in deps[v]:
            remaining[d] += 1
    sinks = set(model.sinks)
    ends: list[FloatArray | None] = [None] * model.n_nodes
    step_end = np.zeros((n_scenarios, source.n_lanes, model.n_steps))

    def start_of(v: int) -> FloatArray | float:
        dv = deps[v]
        if not dv:
            return 0.0
        s = ends[dv[0]]
        if len(dv) > 1:
            s = np.maximum(s, ends[dv[1]])  # type: ignore[arg-type]
            for d in dv[2:]:
                np.maximum(s, ends[d], out=s)  # type: ignore[arg-type]
        for d in dv:
            remaining[d] -= 1
            if remaining[d] == 0:
                ends[d] = None  # nothing else waits for it: free the memory
        return s  # type: ignore[return-value]

    for g in model.groups:
        if not g.is_comm:
            v = g.members[0]
            e = start_of(v) + source(v)
            ends[v] = e
            if v in sinks:
                np.maximum(step_end, e, out=step_end)
            continue
        latest: FloatArray | float = 0.0
        for v in g.members:
            latest = np.maximum(latest, start_of(v))
        if g.dp_sync and source.n_lanes > 1 and isinstance(latest, np.ndarray):
            latest = latest.max(axis=1, keepdims=True)
        for v in g.members:
            e = latest + source(v)
            ends[v] = e
            if v in sinks:
                np.maximum(step_end, e, out=step_end)
    return step_end.max(axis=1)


def simulate_timeline(model: Model, keep: BoolArray | None = None) -> tuple[FloatArray, FloatArray]:
    """Simulated start and end of every node instance, (nodes, dp, steps), for one scenario.

    `keep` (nodes, dp) selects which work stays original (default: all, the original timeline).
    Slower than `simulate` (keeps every array); meant for inspection and tests.
    """
    n, dp, steps = model.n_nodes, model.dp, model.n_steps
    k = np.ones((1, n, dp), bool) if keep is None else keep[None]
    src = FullLanes(model, k)
    start = np.full((n, dp, steps), np.nan)
    end = np.full((n, dp, steps), np.nan)
    deps = model.deps

    def start_of(v: int) -> FloatArray:
        s = np.zeros((dp, steps))
        for d in deps[v]:
            s = np.maximum(s, end[d])
        return s

    for g in model.groups:
        starts = [start_of(v) for v in g.members]
        for v, s in zip(g.members, starts, strict=True):
            start[v] = s
        if not g.is_comm:
            end[g.members[0]] = starts[0] + src(g.members[0])[0]
            continue
        latest = np.max(np.stack(starts), axis=0)
        if g.dp_sync:
            latest = latest.max(axis=0, keepdims=True)
        for v in g.members:
            end[v] = latest + src(v)[0]
    return start, end
