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
from typing import Any, Protocol

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
    """Scenarios over all DP ranks: `keep[s, v, d]` keeps node v's original work on DP rank d.

    `delays=True` gives the launch delays (original or idealised) instead of the work.
    """

    model: Model
    keep: BoolArray  # (scenarios, nodes, dp)
    delays: bool = False

    @property
    def n_lanes(self) -> int:
        """One lane per DP rank."""
        return self.model.dp

    def __call__(self, v: int) -> FloatArray:
        """Original work where kept, the ideal elsewhere."""
        k = self.keep[:, v, :, None]
        m = self.model
        if self.delays:
            out: FloatArray = np.where(k, m.delay[v][None], m.ideal_delay[v])
        else:
            out = np.where(k, m.work[v][None], m.ideal[v])
        return out


@dataclass(frozen=True)
class OneRankLanes:
    """Scenarios in which DP rank `rank[s]` keeps its original work on the nodes `nodes[s]`."""

    model: Model
    rank: IntArray  # (scenarios,)
    nodes: BoolArray  # (scenarios, nodes)
    delays: bool = False

    @property
    def n_lanes(self) -> int:
        """The chosen rank, plus one lane for all other (ideal) ranks when there are any."""
        return 2 if self.model.dp > 1 else 1

    def __call__(self, v: int) -> FloatArray:
        """Lane 0: original or ideal by stage; lane 1: ideal."""
        m = self.model
        n = self.rank.shape[0]
        out = np.empty((n, self.n_lanes, m.n_steps))
        sel = self.nodes[:, v]
        orig, ideal = (m.delay[v], m.ideal_delay[v]) if self.delays else (m.work[v], m.ideal[v])
        out[:, 0, :] = np.where(sel[:, None], orig[self.rank], ideal)
        if self.n_lanes > 1:
            out[:, 1, :] = ideal
        return out


def simulate(model: Model, source: WorkSource, n_scenarios: int, delays: WorkSource | None = None) -> FloatArray:
    """Step times (scenarios, steps) of the simulated timelines; a step starts at 0.

    With `delays` (a source of the same layout giving launch delays), a call starts that long after
    its dependencies end: untraced CPU work is kept in (or idealised out of) the timeline.
    """
    calls = model.calls
    n = len(calls)
    # how many later events still read a call's start (its end, its peers' ends) and end (consumers)
    start_reads = [1 + len(cl.peers) for cl in calls]
    end_reads = [0] * n
    for cl in calls:
        for d in cl.deps:
            end_reads[d] += 1
    sinks = set(model.sinks)
    # Any: numpy's stubs cannot follow the None-when-freed bookkeeping
    starts: list[Any] = [None] * n
    ends: list[Any] = [None] * n
    step_end = np.zeros((n_scenarios, source.n_lanes, model.n_steps))

    for e in model.events:
        c, is_end = e >> 1, e & 1
        call = calls[c]
        if not is_end:
            dv = call.deps
            if not dv:
                starts[c] = 0.0 if delays is None else delays(call.members[0])
                continue
            s = ends[dv[0]]
            if len(dv) > 1:
                s = np.maximum(s, ends[dv[1]])
                for d in dv[2:]:
                    np.maximum(s, ends[d], out=s)
            for d in dv:
                end_reads[d] -= 1
                if end_reads[d] == 0:
                    ends[d] = None  # nothing else waits for it: free the memory
            starts[c] = s if delays is None else s + delays(call.members[0])
            continue
        mem = call.members
        w = source(mem[0])
        for v in mem[1:]:
            w = np.maximum(w, source(v))
        latest = starts[c]
        if call.is_comm:
            for p in call.peers:
                latest = np.maximum(latest, starts[p])
                start_reads[p] -= 1
                if start_reads[p] == 0:
                    starts[p] = None
            if call.dp_sync and source.n_lanes > 1 and isinstance(latest, np.ndarray):
                latest = latest.max(axis=1, keepdims=True)
        end = latest + w
        start_reads[c] -= 1
        if start_reads[c] == 0:
            starts[c] = None
        if c in sinks:
            np.maximum(step_end, end, out=step_end)
        else:
            ends[c] = end
    result: FloatArray = step_end.max(axis=1)
    return result


def simulate_timeline(model: Model, keep: BoolArray | None = None,
                      with_delays: bool = False) -> tuple[FloatArray, FloatArray]:
    """Simulated start and end of every node instance, (nodes, dp, steps), for one scenario.

    `keep` (nodes, dp) selects which work stays original (default: all, the original timeline).
    Slower than `simulate` (keeps every array); meant for inspection and tests.
    """
    n, dp, steps = model.n_nodes, model.dp, model.n_steps
    k = np.ones((1, n, dp), bool) if keep is None else keep[None]
    src = FullLanes(model, k)
    dsrc = FullLanes(model, k, delays=True)
    start = np.full((n, dp, steps), np.nan)
    end = np.full((n, dp, steps), np.nan)
    cs: dict[int, FloatArray] = {}
    ce: dict[int, FloatArray] = {}
    for e in model.events:
        c, is_end = e >> 1, e & 1
        call = model.calls[c]
        if not is_end:
            s = np.zeros((dp, steps))
            for d in call.deps:
                s = np.maximum(s, ce[d])
            if with_delays:
                s = s + dsrc(call.members[0])[0]
            cs[c] = s
            start[list(call.members)] = s
            continue
        w = np.max(np.stack([src(v)[0] for v in call.members]), axis=0)
        latest = cs[c]
        if call.is_comm:
            for p in call.peers:
                latest = np.maximum(latest, cs[p])
            if call.dp_sync:
                latest = latest.max(axis=0, keepdims=True)
        ce[c] = latest + w
        end[list(call.members)] = ce[c]
    return start, end


def simulate_continuous(model: Model, source: WorkSource, n_scenarios: int, delays: WorkSource,
                        stage_of_call: IntArray) -> FloatArray:
    """Job time at the end of every step (scenarios, steps) when the steps run back to back.

    For traces of consecutive iterations (a testbed run): a worker starts step k+1 after it
    finished step k plus its launch delay, so a straggler's lateness carries over into the next
    step the way it does in the measured iteration times. `delays` must hold the cross-step delays
    for the calls that wait for nothing inside a step (see `analysis.continuous_delays`). Python
    cost is per template node and step.
    """
    calls = model.calls
    n, pp, steps = len(calls), int(stage_of_call.max()) + 1, model.n_steps
    work = [np.broadcast_to(source(v), (n_scenarios, source.n_lanes, steps)) for v in range(model.n_nodes)]
    dly = [np.broadcast_to(delays(v), (n_scenarios, source.n_lanes, steps)) for v in range(model.n_nodes)]
    worker_end = np.zeros((pp, n_scenarios, source.n_lanes))
    out = np.zeros((n_scenarios, steps))
    ids = model.trace.step_ids
    for k in range(steps):
        if k > 0 and ids[k] != ids[k - 1] + 1:
            # a new segment (steps in between are not in the trace): it starts when the previous
            # step has ended everywhere
            worker_end = np.broadcast_to(worker_end.max(axis=(0, 2), keepdims=True), worker_end.shape).copy()
        starts: list[Any] = [None] * n
        ends: list[Any] = [None] * n
        new_end = worker_end.copy()
        for e in model.events:
            c, is_end = e >> 1, e & 1
            call = calls[c]
            v0 = call.members[0]
            if not is_end:
                s = worker_end[stage_of_call[c]]
                for d in call.deps:
                    s = np.maximum(s, ends[d])
                starts[c] = s + dly[v0][..., k]
                continue
            w = work[v0][..., k]
            for v in call.members[1:]:
                w = np.maximum(w, work[v][..., k])
            latest = starts[c]
            if call.is_comm:
                for p in call.peers:
                    latest = np.maximum(latest, starts[p])
                if call.dp_sync and source.n_lanes > 1:
                    latest = latest.max(axis=1, keepdims=True)
            ends[c] = latest + w
            st = stage_of_call[c]
            new_end[st] = np.maximum(new_end[st], ends[c])
        worker_end = new_end
        out[:, k] = worker_end.max(axis=(0, 2))
    return out
