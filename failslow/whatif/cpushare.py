"""Shared-CPU replay: what-if timelines for workers that share a host's CPU cores (CPU testbeds).

On a GPU job every worker owns its device, so an operation's duration is its work. On a CPU
testbed several ranks share a few cores: an operation runs slower while other ranks compute, and
faster while they wait. A straggler changes that: while a CPU-capped rank holds the job up, the
others wait, compete less for the cores, and their operations run faster than they would in a
healthy job. Taking their durations as the healthy ones makes the "straggler fixed" timeline too
fast and overestimates the straggler's cost (by 10-30% at DP2 x PP2 on 2 cores).

This module replays a continuous trace (steps back to back) on a processor-sharing model of the
host instead:

* CPU work - compute operations and the launch gaps before every call (Python overhead between
  operations) - is measured as *CPU demand*: the integral over the interval of
  min(1, cores / busy(t)), where busy(t) counts the intervals of all workers running at t, read
  from the trace itself. A worker blocked in a communication call does not count (gloo waits
  sleep).
* Communication calls keep their transfer durations (wall time) and the model's peer rules.
* Simulation: an event-driven processor-sharing replay - at any moment the n running CPU jobs
  each progress at min(1, cores / n) - over the same dependency model, with steps back to back
  (a worker starts step k+1 when it has finished step k).

With the trace's own demands the replay reproduces the trace (the busy profile is the measured
one); a scenario replaces some demands with ideal ones and lets the contention follow. Python
cost is per operation instance (fine for testbed traces; not meant for 1000-GPU traces).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.whatif.model import Model, idealise
from failslow.whatif.trace import OPTYPES

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

_EPS = 1e-12


def busy_rate_integral(starts: FloatArray, ends: FloatArray, cores: float,
                       weight: FloatArray | None = None) -> FloatArray:
    """CPU demand of each interval: the integral of min(1, cores / busy(t)) over it.

    busy(t) is the number of the given intervals that contain t, each counted with its `weight`
    (default 1: the CPUs it keeps busy while it runs). Vectorised: one sort of the interval
    boundaries and a cumulative sum.
    """
    if cores <= 0:
        raise InputError(f"host CPUs must be > 0, got {cores}")
    times = np.concatenate([starts, ends])
    w = np.ones(starts.shape[0]) if weight is None else weight
    delta = np.concatenate([w, -w])
    order = np.argsort(times, kind="stable")
    t = times[order]
    busy = np.cumsum(delta[order])  # intervals running just after each boundary
    seg = np.diff(t)
    rate = np.minimum(1.0, cores / np.maximum(busy[:-1], 1e-9))
    integral = np.concatenate([[0.0], np.cumsum(rate * seg)])
    lo = np.searchsorted(t, starts, side="left")
    hi = np.searchsorted(t, ends, side="left")
    out: FloatArray = np.maximum(integral[hi] - integral[lo], 0.0)
    return out


def demand_model(m: Model, offset: FloatArray, cores: float, weight: FloatArray | None = None,
                 gap_weight: FloatArray | None = None) -> Model:
    """The model with compute work and launch delays as CPU demand (see the module docstring).

    Args:
        m: a continuous model (`analysis.continuous_delays`): `delay` of a call that waits for
            nothing inside its step is counted from its worker's end of the previous step.
        offset: (steps,) start of each step on the job's clock.
        cores: CPU cores the workers share.
        weight: (nodes, dp, steps) how many CPUs a compute op instance keeps busy while it runs
            (default 1). A straggler held back by a CPU cap runs its ops mostly off the CPU:
            counting it as a full competitor would make its peers' demands look smaller than they
            are (see `fix_weights`).
        gap_weight: the same for the launch gap before each call (indexed by the call's first
            node).
    """
    is_comm = np.array([OPTYPES[o].is_comm for o in m.optype.tolist()], dtype=bool)
    comp = np.flatnonzero(~is_comm & m.simulated)
    first = np.array([c.members[0] for c in m.calls], dtype=np.int64)
    abs_start = m.start + offset[None, None, :]
    abs_end = m.end + offset[None, None, :]
    # one busy interval per compute op instance and per call's launch gap
    c_start = abs_start[comp].reshape(-1)
    c_end = abs_end[comp].reshape(-1)
    call_start = np.stack([abs_start[list(c.members)].min(axis=0) for c in m.calls])  # (calls, dp, steps)
    d_end = call_start.reshape(-1)
    d_start = d_end - m.delay[first].reshape(-1)
    wts = None
    if weight is not None or gap_weight is not None:
        ow = np.ones_like(m.work) if weight is None else weight
        gw = np.ones_like(m.work) if gap_weight is None else gap_weight
        wts = np.concatenate([ow[comp].reshape(-1), gw[first].reshape(-1)])
    dem = busy_rate_integral(np.concatenate([c_start, d_start]), np.concatenate([c_end, d_end]), cores, wts)
    work = m.work.copy()
    work[comp] = dem[: c_start.shape[0]].reshape(comp.shape[0], m.dp, m.n_steps)
    delay = m.delay.copy()
    call_delay = dem[c_start.shape[0]:].reshape(len(m.calls), m.dp, m.n_steps)
    for i, c in enumerate(m.calls):
        delay[list(c.members)] = call_delay[i]
    ideal = idealise(work, m.ideal_key, m.optype, m.simulated, m.compute)
    ideal_delay = idealise(delay, m.delay_key, m.optype, m.simulated, "median")
    return replace(m, work=work, delay=delay, ideal=ideal, ideal_delay=ideal_delay)


def fix_scenario(m: Model, offset: FloatArray, cores: float, sel: BoolArray, own: BoolArray,
                 passes: int = 3) -> Model:
    """The demand model of a "straggler fixed" scenario, its ideals taken outside `sel`.

    Args:
        m: the continuous model (wall-clock work and delays).
        offset: (steps,) start of each step on the job's clock.
        cores: CPU cores the workers share.
        sel: (nodes, dp) the work that is idealised (the stragglers' scope).
        own: (nodes, dp) the stragglers' own operations.
        passes: refinements of the stragglers' CPU use (a few suffice; each moves it less).

    While a straggler's op ran it used only the CPU a healthy op needs, not its full share: it
    counts as ideal demand / the demand it shows as a full competitor (at most 1; a capped rank
    well below 1, an uncapped one about 1), its peers' demands are re-read with that weight,
    which in turn refines the ideal. Returns the demand model with `ideal`/`ideal_delay` the mean
    of the operations outside `sel` (median transfer for communication), as in the dedicated
    model's S_fix_top; simulate it with keep = ~sel.
    """
    dm = dm0 = demand_model(m, offset, cores)
    # an op's share of the CPU it would get as a full competitor: its demand read as one
    dur = np.maximum(dm0.work, 1e-12)
    gap = np.maximum(dm0.delay, 1e-12)
    for _ in range(passes + 1):
        ideal = idealise(dm.work, dm.ideal_key, dm.optype, dm.simulated, "mean", exclude=sel)
        ideal_delay = idealise(dm.delay, dm.delay_key, dm.optype, dm.simulated, "mean", exclude=sel)
        dm = replace(dm, ideal=ideal, ideal_delay=ideal_delay)
        if _ == passes:
            break
        weight = np.ones_like(m.work)
        gap_weight = np.ones_like(m.work)
        weight[own] = np.clip(ideal[:, None, None] / dur, 0.0, 1.0)[own]
        gap_weight[own] = np.clip(ideal_delay[:, None, None] / gap, 0.0, 1.0)[own]
        dm = demand_model(m, offset, cores, weight, gap_weight)
    return dm


def simulate_shared(m: Model, keep: BoolArray, cores: float, stage_of_call: IntArray) -> FloatArray:
    """Job time at the end of every step (steps,) of one scenario, steps back to back, on
    `cores` shared CPUs.

    Args:
        m: a demand model (`demand_model`): compute work and delays in CPU seconds.
        keep: (nodes, dp) which work (and launch delay) stays original; the rest is ideal.
        cores: CPU cores the workers share.
        stage_of_call: (calls,) the stage (worker within a DP rank) of each call.
    """
    calls = m.calls
    n_calls, dp, steps = len(calls), m.dp, m.n_steps
    pp = int(stage_of_call.max()) + 1
    work = np.where(keep[:, :, None], m.work, m.ideal[:, None, None])
    dly = np.where(keep[:, :, None], m.delay, m.ideal_delay[:, None, None])
    c_work = np.stack([work[list(c.members)].max(axis=0) for c in calls])  # (calls, dp, steps)
    c_dly = np.stack([dly[c.members[0]] for c in calls])
    is_comm = [c.is_comm for c in calls]
    consumers: list[list[int]] = [[] for _ in range(n_calls)]
    for c, call in enumerate(calls):
        for d in call.deps:
            consumers[d].append(c)
    # whose start each comm call's end waits for: itself and its peers (all lanes when dp_sync)
    needs = [(c, *call.peers) for c, call in enumerate(calls)]
    needed_by: list[list[int]] = [[] for _ in range(n_calls)]
    for c, nd in enumerate(needs):
        if is_comm[c]:
            for p in nd:
                needed_by[p].append(c)
    n_need = [len(nd) * (dp if calls[c].dp_sync else 1) for c, nd in enumerate(needs)]
    stage_calls = [np.flatnonzero(stage_of_call == s).tolist() for s in range(pp)]
    n_on_stage = [len(x) for x in stage_calls]

    def iid(c: int, d: int, k: int) -> int:
        return (k * dp + d) * n_calls + c

    n_inst = n_calls * dp * steps
    pending = np.empty(n_inst, dtype=np.int64)
    for k in range(steps):
        for d in range(dp):
            for c, call in enumerate(calls):
                pending[iid(c, d, k)] = len(call.deps) + (1 if k > 0 else 0)
    missing = np.array([n_need[i % n_calls] for i in range(n_inst)], dtype=np.int64)
    latest = np.zeros(n_inst)
    left_on_worker = {(s, d, k): n_on_stage[s] for s in range(pp) for d in range(dp) for k in range(steps)}
    # a step whose id does not follow the previous one starts a new segment, after the whole
    # previous step (what happened between is not in the trace)
    ids = m.trace.step_ids
    seg = [k > 0 and int(ids[k]) != int(ids[k - 1]) + 1 for k in range(steps)]
    left_in_step = [n_calls * dp] * steps
    step_end = np.zeros(steps)

    jobs: dict[tuple[int, int], float] = {}  # (instance, phase 0 = launch gap / 1 = run) -> CPU left
    timers: list[tuple[float, int]] = []  # (time, instance): communication ends
    now = 0.0
    todo: list[tuple[int, int]] = []  # (instance, what) transitions at `now`: 0 ready, 1 run, 2 done

    def run_phase(i: int) -> None:
        c, rest = i % n_calls, i // n_calls
        d, k = rest % dp, rest // dp
        if not is_comm[c]:
            w = float(c_work[c, d, k])
            if w <= _EPS:
                todo.append((i, 2))
            else:
                jobs[(i, 1)] = w
            return
        for c2 in needed_by[c]:
            lanes = range(dp) if calls[c2].dp_sync else (d,)
            for d2 in lanes:
                j = iid(c2, d2, k)
                latest[j] = max(latest[j], now)
                missing[j] -= 1
                if missing[j] == 0:
                    heapq.heappush(timers, (latest[j] + float(c_work[c2, d2, k]), j))

    def process() -> None:
        while todo:
            i, what = todo.pop()
            c, rest = i % n_calls, i // n_calls
            d, k = rest % dp, rest // dp
            if what == 0:
                g = float(c_dly[c, d, k])
                if g <= _EPS:
                    run_phase(i)
                else:
                    jobs[(i, 0)] = g
            elif what == 1:
                run_phase(i)
            else:
                step_end[k] = max(step_end[k], now)
                for c2 in consumers[c]:
                    j = iid(c2, d, k)
                    pending[j] -= 1
                    if pending[j] == 0:
                        todo.append((j, 0))
                s = int(stage_of_call[c])
                left_on_worker[(s, d, k)] -= 1
                left_in_step[k] -= 1
                if left_in_step[k] == 0 and k + 1 < steps and seg[k + 1]:
                    for j in range(iid(0, 0, k + 1), iid(0, 0, k + 2)):
                        pending[j] -= 1
                        if pending[j] == 0:
                            todo.append((j, 0))
                if left_on_worker[(s, d, k)] == 0 and k + 1 < steps and not seg[k + 1]:
                    for c2 in stage_calls[s]:
                        j = iid(c2, d, k + 1)
                        pending[j] -= 1
                        if pending[j] == 0:
                            todo.append((j, 0))

    for i in np.flatnonzero(pending == 0).tolist():
        todo.append((i, 0))
    process()
    while jobs or timers:
        rate = min(1.0, cores / len(jobs)) if jobs else 0.0
        t_cpu = now + min(jobs.values()) / rate if jobs else np.inf
        t_timer = timers[0][0] if timers else np.inf
        t_next = min(t_cpu, t_timer)
        if jobs:
            spent = rate * (t_next - now)
            finished = []
            for key in jobs:
                jobs[key] -= spent
                if jobs[key] <= _EPS * max(1.0, t_next):
                    finished.append(key)
            for key in finished:
                del jobs[key]
                todo.append((key[0], 1 if key[1] == 0 else 2))
        now = t_next
        while timers and timers[0][0] <= now + _EPS:
            _, i = heapq.heappop(timers)
            todo.append((i, 2))
        process()
    if np.any(pending > 0):
        raise InputError("shared-CPU replay stalled: the dependency model has an unmet wait")
    return step_end
