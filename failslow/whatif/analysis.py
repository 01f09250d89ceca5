"""What-if analysis: how fast would the job run without stragglers, and what makes it slow.

Definitions (after Lin et al., "Understanding Stragglers in Large Model Training Using What-if
Analysis"):

* T: mean step time of the timeline simulated with the trace's own durations; T_ideal: the same with
  every operation idealised (compute: the mean duration of its op type over all workers and steps;
  communication: the median transfer duration of its op type).
* S = T / T_ideal, the job's slowdown; W = 1 - 1/S, the fraction of resources wasted.
* S_X = T_X / T_ideal for a set X of operations (an op type, a DP rank, a stage, a worker), where
  T_X keeps only X's original durations and idealises the rest: the slowdown X alone causes.
* Per-step slowdown: the same ratio per step.
* M_W: the share of the slowdown (T - T_ideal) removed by idealising only the top 3% of workers by
  S_w; M_S: the same for the last pipeline stage. S_fix_top = T / T with only those workers
  idealised, to the ideal of the other workers' operations: how much faster the job would run
  if its worst stragglers behaved like the rest. With `host_cpus` (CPU testbeds) T, T_ideal and
  S_fix_top are also replayed on a processor-sharing model of the shared cores (`cpushare`).
* Simulation error: |T - T_trace| / T_trace, where T_trace is the measured mean step time. The
  analysis refuses (InputError) above `max_sim_error` (5%), because the model then does not explain
  the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.whatif.cpushare import demand_model, fix_scenario, simulate_shared
from failslow.whatif.model import Model, build_model, idealise
from failslow.whatif.rootcause import RootCause, diagnose
from failslow.whatif.simulate import FullLanes, OneRankLanes, simulate, simulate_continuous
from failslow.whatif.trace import OPTYPES, Kind, Trace

FloatArray = npt.NDArray[np.float64]

MAX_SIM_ERROR = 0.05
TOP_WORKER_SHARE = 0.03


@dataclass(frozen=True)
class SharedCpu:
    """Headline figures replayed on a processor-sharing model of a host's CPUs (`cpushare`).

    For CPU testbeds whose ranks share a few cores: the straggler's idle peers compete less for
    the cores, so its cost is judged with the contention it would have caused.
    """

    host_cpus: float
    T: float  # replay of the trace (check: close to the measured period)
    T_ideal: float
    T_fix_top: float  # the M_W workers idealised to the others' ideal

    def to_json(self, T_trace: float) -> dict[str, float]:
        """JSON summary; `T_trace` is the measured mean period."""
        return {"host_cpus": self.host_cpus, "T_sim_s": self.T, "T_ideal_s": self.T_ideal,
                "T_fix_top_s": self.T_fix_top, "S": self.T / self.T_ideal, "S_fix_top": self.T / self.T_fix_top,
                "simulation_error": abs(self.T - T_trace) / T_trace if T_trace > 0 else math.inf}


@dataclass(frozen=True)
class WhatIfResult:
    """Everything the analysis found about one trace (see the module docstring for definitions)."""

    job: str
    ideal: str
    equalise: str
    dp: int
    pp: int
    vpp: int
    n_ops: int
    steps: tuple[int, ...]
    T_trace: float
    T: float
    T_ideal: float
    S: float
    W: float
    S_t: dict[str, float]
    S_dp: dict[int, float]
    S_stage: dict[int, float]
    S_w: FloatArray  # (dp, pp)
    per_step: dict[int, float]
    M_W: float | None
    M_W_workers: tuple[tuple[int, int], ...]
    T_fix_top: float  # T with only the M_W workers idealised
    M_S: float | None
    simulation_error: float
    simulation_error_max_step: float
    simulation_error_without_delays: float
    launch_delays: str
    root_cause: RootCause
    step_T: FloatArray = field(repr=False)
    step_T_ideal: FloatArray = field(repr=False)
    step_T_trace: FloatArray = field(repr=False)
    shared_cpu: SharedCpu | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the `failslow whatif` output)."""
        return {
            "job": self.job,
            "ideal": self.ideal,
            "equalise": self.equalise,
            "layout": {"dp": self.dp, "pp": self.pp, "vpp": self.vpp},
            "n_ops": self.n_ops,
            "n_steps": len(self.steps),
            "S": self.S,
            "W": self.W,
            "S_t": self.S_t,
            "S_w": [{"dp_rank": d, "pp_rank": p, "S_w": float(self.S_w[d, p])}
                    for d in range(self.dp) for p in range(self.pp)],
            "S_dp": {str(k): v for k, v in self.S_dp.items()},
            "S_stage": {str(k): v for k, v in self.S_stage.items()},
            "per_step": {str(k): v for k, v in self.per_step.items()},
            "M_W": self.M_W,
            "M_W_workers": [{"dp_rank": d, "pp_rank": p} for d, p in self.M_W_workers],
            "S_fix_top": self.T / self.T_fix_top,
            "M_S": self.M_S,
            "T_trace_s": self.T_trace,
            "T_sim_s": self.T,
            "T_ideal_s": self.T_ideal,
            "simulation_error": self.simulation_error,
            "simulation_error_max_step": self.simulation_error_max_step,
            "simulation_error_without_delays": self.simulation_error_without_delays,
            "launch_delays": self.launch_delays,
            "root_cause": self.root_cause.to_json(),
            "shared_cpu": None if self.shared_cpu is None else self.shared_cpu.to_json(self.T_trace),
        }


def continuous_delays(m: Model, equalise: str = "all") -> tuple[Model, FloatArray, FloatArray]:
    """The model with cross-step launch delays, the trace's iteration periods (steps,) and the
    steps' start offsets on the job's clock (steps,).

    Timestamps are relative to each step's start, so the offset between consecutive steps is
    estimated: no worker starts step k+1 before it ended step k, and the tightest worker turns
    around at once. The delay of a call that waits for nothing inside its step is then its start
    minus its worker's end of the previous step; these get their own ideal (the per op type median
    over such calls) so an ideal step keeps a typical step-start gap. (A testbed trace records each
    worker's `step-overhead` from the end of its previous iteration, so the estimate is exact.)

    A step whose id does not follow the previous one (a selection of iterations, e.g. the faulty
    windows of a run) starts a new segment: what happened between is not in the trace, so it starts
    when the previous step has ended everywhere, and its free calls' delays count from its own
    start, as in the trace's first step (see `segment_starts`).
    """
    pp, dp, steps = int(m.trace.meta.pp_size), m.dp, m.n_steps
    first = np.full((pp, dp, steps), np.inf)
    last = np.full((pp, dp, steps), -np.inf)
    for p in range(pp):
        on = (m.stage == p) & m.simulated
        if on.any():
            first[p] = m.start[on].min(axis=0)
            last[p] = m.end[on].max(axis=0)
    seg = segment_starts(m)
    gap = np.zeros(steps)  # offset of step k from step k-1
    if steps > 1:
        gap[1:] = np.where(seg[1:], np.max(last[:, :, :-1], axis=(0, 1)),
                           np.max(last[:, :, :-1] - first[:, :, 1:], axis=(0, 1)))
    offset = np.cumsum(gap)
    free = [c for c in m.calls if not c.deps]
    delay = m.delay.copy()
    for c in free:
        mem = list(c.members)
        p = int(m.stage[mem[0]])
        prev_end = np.concatenate([np.zeros((dp, 1)), last[p][:, :-1] + offset[None, :-1]], axis=1)
        prev_end = np.where(seg[None, :], offset[None, :], prev_end)
        start_abs = m.start[mem].min(axis=0) + offset[None, :]
        delay[mem] = np.maximum(start_abs - prev_end, 0.0)
    free_nodes = np.zeros(m.n_nodes, bool)
    for c in free:
        free_nodes[list(c.members)] = True
    key = m.optype * 2 + free_nodes if equalise == "all" else (m.optype * 2 + free_nodes) * (pp + 1) + m.stage
    ideal_delay = idealise(delay, key, m.optype, m.simulated, "median")
    ends = np.max(last, axis=(0, 1)) + offset  # the job's time at the end of each step
    period: FloatArray = np.diff(ends, prepend=0.0)
    return replace(m, delay=delay, ideal_delay=ideal_delay, delay_key=key), period, offset


def segment_starts(m: Model) -> npt.NDArray[np.bool_]:
    """(steps,) True where a step does not follow the previous one (its id is not the previous + 1)."""
    ids = m.trace.step_ids
    out: npt.NDArray[np.bool_] = np.concatenate([[True], np.diff(ids) != 1])
    return out


def worker_scopes(m: Model) -> npt.NDArray[np.bool_]:
    """(pp, nodes): the template nodes that belong to the worker of each stage in S_w and M_W.

    A worker's own ops plus the matching send/recv of its P2P ops on the adjacent stages: a
    transfer needs both ends, so a worker that is slow to serve its side (a throttled CPU driving
    the transfer) shows up in its peers' transfer times as well.
    """
    pp = int(m.trace.meta.pp_size)
    scope = np.zeros((pp, m.n_nodes), bool)
    for p in range(pp):
        own = m.stage == p
        scope[p] = own
        partners = m.p2p_peer[own & (m.p2p_peer >= 0)]
        scope[p, partners] = True
    return scope


def _share(t: float, t_part: float, t_ideal: float) -> float | None:
    gap = t - t_ideal
    if gap <= 1e-9 * max(t, 1e-12):
        return None
    return float((t - t_part) / gap)


def analyze(trace: Trace, *, job: str | None = None, max_sim_error: float = MAX_SIM_ERROR,
            top_share: float = TOP_WORKER_SHARE, ideal: str = "mean", equalise: str = "all",
            launch_delays: str = "drop", continuous: bool = False, host_cpus: float | None = None,
            model: Model | None = None) -> WhatIfResult:
    """Run the whole what-if analysis of a trace.

    Args:
        trace: a validated trace (`read_trace` / `trace_from_columns`).
        job: name reported in the result (default: the metadata's trial name).
        max_sim_error: refuse (InputError) when the simulated original timeline's mean step time is
            further than this from the measured one.
        top_share: fraction of workers whose idealisation M_W measures.
        ideal: idealised compute duration per op type: "mean" (the study's definition) or "median"
            (robust when one straggler is a large share of a small job's workers).
        equalise: "all" ops of a type share one ideal duration (the study's definition) or only
            those on one "stage" (stage partitioning imbalance is then not counted as straggling).
        launch_delays: "drop" (the study's method: untraced CPU gaps between an op's
            dependencies and its start are left out of every timeline, and the simulation error
            measures them) or "ideal" (they stay in the timelines as work of their op: original in
            the original timeline, the per op type median in the ideal one; for traces whose CPU
            work is on the critical path but not recorded, like CPU testbeds).
        continuous: the trace's steps are consecutive iterations that run back to back (a
            testbed run): simulate them in sequence, so lateness carries over into the next step as
            in measured iteration times, and T is the mean iteration period. Steps whose id does
            not follow the previous one start a new segment; the first step of each segment only
            places the workers and is left out of T (unless every step starts one). Implies
            launch_delays="ideal"; the delay before a worker's first op of a step is measured from
            its end of the previous step (step offsets estimated from the trace, see
            `continuous_delays`).
        host_cpus: the workers share this many CPU cores (a CPU testbed on one host): also
            replay T, T_ideal and T_fix_top on a processor-sharing model of those cores
            (`cpushare`; needs `continuous`), reported as `shared_cpu`.
        model: a dependency model already built for `trace`.
    """
    if host_cpus is not None and not (continuous and host_cpus > 0):
        raise InputError("host_cpus needs continuous mode and a positive number of CPUs")
    if launch_delays not in ("drop", "ideal"):
        raise InputError(f"launch_delays must be 'drop' or 'ideal', not {launch_delays!r}")
    m = model if model is not None else build_model(trace, ideal, equalise)
    step_offset: FloatArray = np.zeros(trace.n_steps)
    counted = np.ones(trace.n_steps, bool)  # the steps whose times make T
    if continuous:
        launch_delays = "ideal"
        m, trace_period, step_offset = continuous_delays(m, equalise)
        # the first step of a segment only places the workers: its period is not measured (what
        # came before it is not in the trace), like a warm-up iteration
        seg = segment_starts(m)
        if not seg.all():
            counted = ~seg
    use_delays = launch_delays == "ideal"
    call_stage = np.array([int(m.stage[c.members[0]]) for c in m.calls], dtype=np.int64)

    def sim(src: FullLanes | OneRankLanes, dsrc: FullLanes | OneRankLanes, n_scen: int) -> FloatArray:
        if continuous:
            ends = simulate_continuous(m, src, n_scen, dsrc, call_stage)
            out: FloatArray = np.diff(ends, axis=1, prepend=0.0)[:, counted]  # per-step share of the job time
            return out
        return simulate(m, src, n_scen, dsrc if use_delays else None)

    def full(keep: npt.NDArray[np.bool_]) -> FloatArray:
        return sim(FullLanes(m, keep), FullLanes(m, keep, delays=True), keep.shape[0])
    meta = trace.meta
    dp, pp, n = meta.dp_size, meta.pp_size, m.n_nodes

    # --- batch 1: every scenario that needs all DP ranks
    group_of = np.array([OPTYPES[o].group for o in m.optype.tolist()], dtype=object)
    group_names = list(dict.fromkeys(g for g, s in zip(group_of.tolist(), m.simulated.tolist(), strict=True)
                                     if s))
    masks = [np.ones(n, bool), np.zeros(n, bool)]
    masks += [group_of == g for g in group_names]
    masks += [m.stage == p for p in range(pp)]
    masks.append(m.stage != pp - 1)  # M_S: idealise only the last stage
    keep = np.repeat(np.stack(masks)[:, :, None], dp, axis=2)
    t1 = full(keep)
    step_t, step_ideal = t1[0], t1[1]
    T, T_ideal = float(step_t.mean()), float(step_ideal.mean())
    if not T_ideal > 0:
        raise InputError("the idealised timeline has zero length: the trace records no time")
    i = 2
    S_t = {g: float(t1[i + k].mean() / T_ideal) for k, g in enumerate(group_names)}
    i += len(group_names)
    S_stage = {p: float(t1[i + p].mean() / T_ideal) for p in range(pp)}
    i += pp
    M_S = _share(T, float(t1[i].mean()), T_ideal) if pp > 1 else None

    # --- batch 2: one DP rank differs from the ideal (per DP rank, per worker)
    scope = worker_scopes(m)  # (pp, nodes)
    ranks = np.concatenate([np.arange(dp), np.repeat(np.arange(dp), pp)])
    nodes = np.concatenate([np.ones((dp, n), bool), np.tile(scope, (dp, 1))])
    t2 = sim(OneRankLanes(m, ranks, nodes), OneRankLanes(m, ranks, nodes, delays=True), ranks.shape[0])
    S_dp = {d: float(t2[d].mean() / T_ideal) for d in range(dp)}
    S_w = (t2[dp:].mean(axis=1) / T_ideal).reshape(dp, pp)

    # --- batch 3: M_W, idealise only the top workers by S_w
    k = max(1, math.ceil(dp * pp * top_share))
    order = np.argsort(-S_w.reshape(-1), kind="stable")[:k]
    top = tuple((int(w // pp), int(w % pp)) for w in order)
    sel = np.zeros((n, dp), bool)
    dp_coll = np.array([OPTYPES[o].kind == Kind.DP_COLL for o in m.optype.tolist()], dtype=bool)
    for d, p in top:
        sel[scope[p], d] = True
        # the DP collectives it takes part in are shared: a worker slow to serve its part of a
        # (CPU-driven) ring slows every member's transfer, so fixing it fixes them all
        sel[dp_coll & (m.stage == p), :] = True
    t3 = full((~sel)[None])
    M_W = _share(T, float(t3[0].mean()), T_ideal)
    # S_fix_top: the same workers made as fast as the *others* are - their ideal taken from the
    # operations outside their scope. With few workers a straggler is a large share of the
    # samples (half of a DP2 stage's collectives), and an ideal that includes it would keep part
    # of its slowness in the "fixed" timeline. The others' *mean* (whatever --ideal says): their
    # samples hold no straggler to be robust against, and the median of right-skewed durations
    # (contention spikes that would hit the fixed workers too) is below what they cost on average.
    m_fix = replace(m, ideal=idealise(m.work, m.ideal_key, m.optype, m.simulated, "mean", exclude=sel),
                    ideal_delay=idealise(m.delay, m.delay_key, m.optype, m.simulated, "mean", exclude=sel))
    keep_fix = (~sel)[None]
    if continuous:
        t4 = np.diff(simulate_continuous(m_fix, FullLanes(m_fix, keep_fix), 1, FullLanes(m_fix, keep_fix, delays=True),
                                         call_stage), axis=1, prepend=0.0)[:, counted]
    else:
        t4 = simulate(m_fix, FullLanes(m_fix, keep_fix), 1,
                      FullLanes(m_fix, keep_fix, delays=True) if use_delays else None)

    shared = None
    if host_cpus is not None:
        dm = demand_model(m, step_offset, host_cpus)
        ones = np.ones((n, dp), bool)

        def shared_T(model: Model, keep: npt.NDArray[np.bool_]) -> float:
            ends = simulate_shared(model, keep, float(host_cpus), call_stage)
            return float(np.diff(ends, prepend=0.0)[counted].mean())

        own = np.zeros((n, dp), bool)
        for d, p in top:
            own[m.stage == p, d] = True
        d_fix = fix_scenario(m, step_offset, float(host_cpus), sel, own)
        shared = SharedCpu(float(host_cpus), shared_T(dm, ones), shared_T(dm, ~ones), shared_T(d_fix, ~sel))

    step_trace = trace.step_times() if not continuous else trace_period[counted]
    T_trace = float(step_trace.mean())
    err = abs(T - T_trace) / T_trace if T_trace > 0 else math.inf
    err_step = float(np.max(np.abs(step_t - step_trace) / np.maximum(step_trace, 1e-12)))
    if use_delays:  # also how far the model alone (without the measured gaps) is off
        t0 = simulate(m, FullLanes(m, np.ones((1, n, dp), bool)), 1)[0][counted]
        err_nodelay = abs(float(t0.mean()) - T_trace) / T_trace if T_trace > 0 else math.inf
    else:
        err_nodelay = err
    if not err <= max_sim_error:
        raise InputError(
            f"simulation error {err:.1%} exceeds {max_sim_error:.0%}: the dependency model reproduces a mean "
            f"step time of {T:.4g} s but the trace measures {T_trace:.4g} s, so its what-if estimates would "
            f"not be trustworthy (gaps not explained by recorded operations, e.g. untraced CPU work)")

    S = T / T_ideal
    res_wo_cause = dict(S=S, S_t=S_t, S_stage=S_stage, S_dp=S_dp, S_w=S_w, M_W=M_W, M_S=M_S)
    cause = diagnose(m, **res_wo_cause)
    return WhatIfResult(
        job=job if job is not None else meta.trial_name, ideal=ideal, equalise=equalise,
        dp=dp, pp=pp, vpp=meta.vpp_size, n_ops=trace.n_ops,
        steps=tuple(int(s) for s in trace.step_ids),
        T_trace=T_trace, T=T, T_ideal=T_ideal, S=S, W=1.0 - 1.0 / S,
        S_t=dict(sorted(S_t.items(), key=lambda kv: -kv[1])),
        S_dp=S_dp, S_stage=S_stage, S_w=S_w,
        per_step={int(s): float(a / b) for s, a, b in zip(trace.step_ids[counted], step_t, step_ideal, strict=True)},
        M_W=M_W, M_W_workers=top, T_fix_top=float(t4[0].mean()), M_S=M_S,
        simulation_error=float(err), simulation_error_max_step=err_step,
        simulation_error_without_delays=float(err_nodelay), launch_delays=launch_delays,
        root_cause=cause, step_T=step_t, step_T_ideal=step_ideal, step_T_trace=step_trace, shared_cpu=shared,
    )
