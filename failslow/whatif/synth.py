"""Seeded synthetic traces of hybrid-parallel (DP x PP) training, with ground-truth stragglers.

The generator *executes* a Megatron-style program per pipeline stage - params all-gather, the 1F1B
or interleaved (virtual pipeline) compute order, blocking P2P calls fused like Megatron's
``send_forward_recv_backward``, post-backward collectives and the optimizer - with one lane per
(DP rank, step), and records every operation the way the what-if trace schema expects. It does not
share code with the analysis' dependency model: the analysis has to rediscover the dependencies from
the timestamps.

Faults (the ground truth): slow workers (compute x factor), stage partitioning imbalance (a stage's
compute x factor on every DP rank), sequence-length imbalance (a per-micro-batch length factor shared
by its forward and backward on all stages), GC pauses. `generate(cfg)` and
`generate(healthy(cfg))` draw the same random numbers, so their step times give the slowdown the
faults really cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.whatif import trace as tr
from failslow.whatif.trace import OPTYPES, JobMeta

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SynthConfig:
    """Shape, timing and faults of a synthetic job. Times in seconds."""

    dp: int = 2
    pp: int = 4
    vpp: int = 1
    micro_batches: int = 8
    steps: int = 4
    t_fwd: float = 0.010  # forward of one micro-batch through a whole stage (all its chunks)
    bwd_ratio: float = 2.0
    t_p2p: float = 0.0004
    t_ag: float = 0.004
    t_rs: float = 0.006
    t_emb: float = 0.002
    t_ln: float = 0.00005
    t_clip: float = 0.001
    t_opt: float = 0.005
    noise_cv: float = 0.02
    launch_delay: float = 0.0001  # mean of the exponential CPU gap before each call
    slow_workers: tuple[tuple[int, int, float], ...] = ()  # (dp_rank, stage, compute factor)
    stage_factors: tuple[tuple[int, float], ...] = ()  # (stage, compute factor)
    seq_cv: float = 0.0  # spread of micro-batch lengths (lognormal sigma)
    gc_prob: float = 0.0  # probability a worker pauses for GC in a step
    gc_pause: float = 0.0  # mean pause length
    seed: int = 0
    name: str = "synthetic"


@dataclass(frozen=True)
class SynthTrace:
    """A generated trace: columns in the trace schema, layout, measured step times, ground truth."""

    columns: dict[str, Any]
    meta: JobMeta
    step_times: FloatArray
    truth: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_step_time(self) -> float:
        """Measured mean step time."""
        return float(self.step_times.mean())

    def trace(self) -> tr.Trace:
        """The validated `Trace`."""
        return tr.trace_from_columns(self.columns, self.meta)


def healthy(cfg: SynthConfig) -> SynthConfig:
    """The same job without faults (same seed, so the same noise)."""
    return replace(cfg, slow_workers=(), stage_factors=(), seq_cv=0.0, gc_prob=0.0, gc_pause=0.0)


def truth_of(cfg: SynthConfig) -> dict[str, Any]:
    """The injected causes of a configuration."""
    causes = []
    if cfg.slow_workers:
        causes.append("individual_worker")
    if cfg.stage_factors:
        causes.append("stage_partitioning_imbalance")
    if cfg.seq_cv > 0:
        causes.append("sequence_length_imbalance")
    if cfg.gc_prob > 0 and cfg.gc_pause > 0:
        causes.append("gc_pauses")
    return {"causes": causes or ["none"], "slow_workers": [list(w) for w in cfg.slow_workers],
            "stage_factors": [list(s) for s in cfg.stage_factors]}


def compute_order(pp: int, vpp: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """Megatron's compute order on one stage: (direction 'F'/'B', chunk, micro-batch)."""
    total = m * vpp
    if vpp == 1:
        warm = min(pp - stage - 1, m)

        def f(k: int) -> tuple[int, int]:
            return 0, k

        def b(k: int) -> tuple[int, int]:
            return 0, k
    else:
        if m % pp:
            raise InputError(f"interleaved schedule needs micro_batches ({m}) divisible by pp ({pp})")
        warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)

        def f(k: int) -> tuple[int, int]:
            return (k % (pp * vpp)) // pp, (k // (pp * vpp)) * pp + k % pp

        def b(k: int) -> tuple[int, int]:
            return vpp - 1 - (k % (pp * vpp)) // pp, (k // (pp * vpp)) * pp + k % pp
    order = [("F", *f(k)) for k in range(warm)]
    for i in range(total - warm):
        order.append(("F", *f(warm + i)))
        order.append(("B", *b(i)))
    order += [("B", *b(i)) for i in range(total - warm, total)]
    return order


def _program(cfg: SynthConfig, s: int) -> list[tuple[Any, ...]]:
    """The instruction list of stage `s` (identical for every DP rank and step)."""
    pp, vpp = cfg.pp, cfg.vpp
    g_last = pp * vpp - 1
    order = compute_order(pp, vpp, cfg.micro_batches, s)

    def needs(d: str, c: int, mb: int) -> tuple[int, Any] | None:  # the recv a compute needs
        g = c * pp + s
        if d == "F":
            return (tr.FRECV, ("f", g - 1, mb)) if g > 0 else None
        return (tr.BRECV, ("b", g + 1, mb)) if g < g_last else None

    def sends(d: str, c: int, mb: int) -> tuple[int, Any] | None:
        g = c * pp + s
        if d == "F":
            return (tr.FSEND, ("f", g, mb)) if g < g_last else None
        return (tr.BSEND, ("b", g, mb)) if g > 0 else None

    prog: list[tuple[Any, ...]] = [("dp", tr.PARAMS_AG, c) for c in range(vpp)]
    first = needs(*order[0])
    if first is not None:
        prog.append(("p2p", [first]))

    def fused(*xs: tuple[int, Any] | None) -> None:
        ops = [x for x in xs if x is not None]
        if ops:
            prog.append(("p2p", ops))

    if vpp == 1:
        # 1F1B: after each compute, send its output and receive the next compute's input together
        # (send_forward_recv_backward / send_backward_recv_forward in the steady state)
        for i, (d, c, mb) in enumerate(order):
            prog.append(("comp", d, c, mb))
            fused(sends(d, c, mb), needs(*order[i + 1]) if i + 1 < len(order) else None)
        return _tail(prog, cfg, s)
    # interleaved: warm-up forwards, then (F, B) pairs followed by one 4-way exchange, then cool-down
    fwds = [o for o in order if o[0] == "F"]
    bwds = [o for o in order if o[0] == "B"]
    warm = min((pp - s - 1) * 2 + (vpp - 1) * pp, len(fwds))  # as in compute_order
    rest = len(fwds) - warm
    for k in range(warm):
        prog.append(("comp", *fwds[k]))
        nxt_f = needs(*fwds[k + 1]) if k + 1 < len(fwds) else None
        nxt_b = needs(*bwds[0]) if (k == warm - 1 and rest > 0) else None
        fused(sends(*fwds[k]), nxt_f, nxt_b)
    for i in range(rest):
        prog.append(("comp", *fwds[warm + i]))
        prog.append(("comp", *bwds[i]))
        nxt_f = needs(*fwds[warm + i + 1]) if warm + i + 1 < len(fwds) else None
        nxt_b = needs(*bwds[i + 1]) if i + 1 < len(bwds) else None
        fused(sends(*fwds[warm + i]), sends(*bwds[i]), nxt_f, nxt_b)
    if rest == 0 and bwds:
        fused(needs(*bwds[0]))
    for j in range(rest, len(bwds)):
        prog.append(("comp", *bwds[j]))
        fused(sends(*bwds[j]), needs(*bwds[j + 1]) if j + 1 < len(bwds) else None)
    return _tail(prog, cfg, s)


def _tail(prog: list[tuple[Any, ...]], cfg: SynthConfig, s: int) -> list[tuple[Any, ...]]:
    """Post-backward collectives and the optimizer."""
    pp, vpp = cfg.pp, cfg.vpp
    prog.append(("local", tr.GC))
    prog.append(("ln",))
    if pp > 1 and s in (0, pp - 1):
        prog.append(("emb",))
    prog += [("dp", tr.GRADS_RS, c) for c in reversed(range(vpp))]
    prog.append(("clip",))
    prog.append(("local", tr.OPTIMIZER))
    return prog


def generate(cfg: SynthConfig) -> SynthTrace:
    """Execute the job and record its trace (see the module docstring)."""
    dp, pp, vpp, m, n_steps = cfg.dp, cfg.pp, cfg.vpp, cfg.micro_batches, cfg.steps
    if min(dp, pp, vpp, m, n_steps) < 1:
        raise InputError("dp, pp, vpp, micro_batches and steps must be >= 1")
    rng = np.random.default_rng(cfg.seed)
    shape = (dp, n_steps)
    comp_factor = np.ones((dp, pp))
    for d, s, f in cfg.slow_workers:
        comp_factor[d, s] *= f
    for s, f in cfg.stage_factors:
        comp_factor[:, s] *= f
    # micro-batch lengths: shared by forward and backward and by all stages
    seq = np.exp(rng.normal(0.0, 1.0, size=(m, dp, n_steps)) * cfg.seq_cv)
    if cfg.seq_cv > 0:
        seq /= seq.mean()
    gc_draw = rng.random((pp, dp, n_steps))
    gc_len = rng.uniform(0.5, 1.5, size=(pp, dp, n_steps)) * cfg.gc_pause
    gc_dur = np.where(gc_draw < cfg.gc_prob, gc_len, 0.0)

    def noisy(base: float) -> FloatArray:
        return base * np.exp(rng.normal(0.0, cfg.noise_cv, size=shape))

    def delay() -> FloatArray:
        return rng.exponential(cfg.launch_delay, size=shape) if cfg.launch_delay > 0 else np.zeros(shape)

    progs = [_program(cfg, s) for s in range(pp)]
    ip = [0] * pp
    now = [np.zeros(shape) for _ in range(pp)]
    posted: dict[Any, FloatArray] = {}  # p2p key+role -> (start, transfer)
    pending: list[dict[str, Any] | None] = [None] * pp  # a started blocking instruction per stage
    rendezvous: dict[str, dict[int, FloatArray]] = {"emb": {}, "clip": {}}
    seq_ctr: dict[tuple[int, int], int] = {}
    rec: list[tuple[int, int, int, int, int, int, FloatArray, FloatArray]] = []

    def record(s: int, ot: int, mc: int, gmc: int, mb: int, start: FloatArray, end: FloatArray) -> None:
        k = seq_ctr.get((s, ot), 0)
        seq_ctr[(s, ot)] = k + 1
        rec.append((s, ot, k, mc, gmc, mb, start, end - start))

    done = 0
    while done < pp:
        progressed = False
        for s in range(pp):
            prog = progs[s]
            while ip[s] < len(prog):
                ins = prog[ip[s]]
                kind = ins[0]
                if kind == "comp":
                    _, d, c, mb = ins
                    base = cfg.t_fwd / vpp * (1.0 if d == "F" else cfg.bwd_ratio)
                    dur = noisy(base) * comp_factor[:, s, None] * seq[mb]
                    st = now[s] + delay()
                    now[s] = st + dur
                    record(s, tr.FWD if d == "F" else tr.BWD, c, c * pp + s, mb, st, now[s])
                elif kind == "local":
                    ot = ins[1]
                    dur = gc_dur[s] if ot == tr.GC else noisy(cfg.t_opt)
                    st = now[s] + delay()
                    now[s] = st + dur
                    record(s, ot, -1, -1, 0 if ot == tr.GC else -1, st, now[s])
                elif kind == "ln":
                    st = now[s] + delay()
                    now[s] = st + noisy(cfg.t_ln)
                    record(s, tr.LAYERNORM_AR, -1, -1, -1, st, now[s])
                elif kind == "dp":
                    _, ot, c = ins
                    st = now[s] + delay()
                    xfer = noisy(cfg.t_ag if ot == tr.PARAMS_AG else cfg.t_rs)
                    now[s] = st.max(axis=0, keepdims=True) + xfer
                    record(s, ot, c, -1, -1, st, now[s])
                elif kind == "p2p":
                    pend = pending[s]
                    if pend is None:
                        st = now[s] + delay()
                        ops = [(ot, key, noisy(cfg.t_p2p)) for ot, key in ins[1]]
                        for ot, key, _x in ops:
                            role = "s" if ot in (tr.FSEND, tr.BSEND) else "r"
                            posted[(key, role)] = st
                        pend = pending[s] = {"start": st, "ops": ops}
                    ready = all((key, "r" if ot in (tr.FSEND, tr.BSEND) else "s") in posted
                                for ot, key, _ in pend["ops"])
                    if not ready:
                        break
                    st = pend["start"]
                    end = st
                    for ot, key, x in pend["ops"]:
                        peer = posted[(key, "r" if ot in (tr.FSEND, tr.BSEND) else "s")]
                        end = np.maximum(end, np.maximum(st, peer) + x)
                    for ot, _key, _x in pend["ops"]:
                        record(s, ot, -1, -1, -1, st, end)  # fused calls end together
                    now[s] = end
                    pending[s] = None
                elif kind in ("emb", "clip"):
                    starts = rendezvous[kind]
                    if s not in starts:
                        starts[s] = now[s] + delay()
                    members = (0, pp - 1) if kind == "emb" else tuple(range(pp))
                    if not all(q in starts for q in members):
                        break
                    ends = rendezvous.setdefault(kind + "_end", {})
                    if not ends:  # the last member to arrive completes the collective for all
                        latest = np.max(np.stack([starts[q] for q in members]), axis=0)
                        if kind == "clip":
                            latest = latest.max(axis=0, keepdims=True)
                        for q in members:
                            ends[q] = latest + noisy(cfg.t_emb if kind == "emb" else cfg.t_clip)
                    record(s, tr.EMBEDDING_AR if kind == "emb" else tr.CLIP, -1, -1, -1, starts[s], ends[s])
                    now[s] = ends[s]
                else:  # pragma: no cover - programs are built above
                    raise AssertionError(kind)
                ip[s] += 1
                progressed = True
                if ip[s] == len(prog):
                    done += 1
        if not progressed and done < pp:
            raise RuntimeError(f"synthetic schedule deadlocked at {ip} (pp={pp}, vpp={vpp}, m={m})")

    return _assemble(cfg, rec)


def _assemble(cfg: SynthConfig, rec: list[tuple[int, int, int, int, int, int, FloatArray, FloatArray]]) -> SynthTrace:
    dp, n_steps = cfg.dp, cfg.steps
    n_rec = len(rec)
    cell = dp * n_steps
    stage = np.repeat(np.array([r[0] for r in rec], dtype=np.int64), cell)
    optype = np.repeat(np.array([r[1] for r in rec], dtype=np.int64), cell)
    seq_id = np.repeat(np.array([r[2] for r in rec], dtype=np.int64), cell)
    mc = np.repeat(np.array([r[3] for r in rec], dtype=np.int64), cell)
    gmc = np.repeat(np.array([r[4] for r in rec], dtype=np.int64), cell)
    mb = np.repeat(np.array([r[5] for r in rec], dtype=np.int64), cell)
    start = np.stack([np.broadcast_to(r[6], (dp, n_steps)) for r in rec]).reshape(-1)
    dur = np.stack([np.broadcast_to(r[7], (dp, n_steps)) for r in rec]).reshape(-1)
    dpr = np.tile(np.repeat(np.arange(dp), n_steps), n_rec)
    step = np.tile(np.tile(np.arange(n_steps), dp), n_rec) + 100
    # gc records the micro-batch column as 0 like the real traces; others -1 unless compute
    columns: dict[str, Any] = {
        "dp_rank": dpr, "stage": stage, "rank": dpr + dp * stage, "step": step,
        "optype": (optype, [t.name for t in OPTYPES]),
        "start_ts": start, "duration": np.maximum(dur, 0.0), "seq_id": seq_id, "mc": mc, "gmc": gmc, "mb_id": mb,
    }
    end = (start + dur).reshape(n_rec, dp, n_steps)
    step_times = end.max(axis=(0, 1)) - start.reshape(n_rec, dp, n_steps).min(axis=(0, 1))
    meta = JobMeta(dp_size=dp, pp_size=cfg.pp, vpp_size=cfg.vpp, trial_name=cfg.name)
    return SynthTrace(columns=columns, meta=meta, step_times=step_times, truth=truth_of(cfg))
