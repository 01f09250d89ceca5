"""The dependency model: which operation waits for which, shared by every step and DP rank.

A training step of a hybrid-parallel job repeats the same program on every DP rank, so the model is
built once for one *template*: the operations of one DP rank in one step, all stages together (one
node per (stage, optype, seq_id)). Every (DP rank, step) pair is a *lane* that runs the template with
its own durations; the simulator processes all lanes (and all what-if scenarios) of a node in one
numpy operation.

Streams per worker (after Megatron-LM): one main stream (compute, gc, optimizer and the collectives
issued synchronously on it: layernorm/embedding grads all-reduce, grad-norm clip), one DP
communication stream (params all-gather, grads reduce-scatter, separate grads all-reduce) and four
PP streams (forward-send, forward-recv, backward-send, backward-recv). Edges:

* same-stream order (the trace's order);
* a receive before the compute that consumes it, a compute before the send of its output;
* CPU issue order, inferred from the template's (median) timing: an op waits for the last
  main-stream op and the last DP collective that ended before it started, and a blocking call (the
  next main-stream op started only after it ended) is waited for by that next op - this captures
  Megatron's fused send/recv calls of 1F1B and interleaved schedules without hard-coding either;
* params all-gather of a model chunk before the chunk's first forward; every grads reduce-scatter
  before the optimizer phase (grad-norm clip, or the optimizer when there is none).

Calls: the nodes of one worker that start and end together - a local op, a collective, or a batched
P2P call whose parts each pair with the matching op of the adjacent stage (per channel, FIFO).
DP collectives synchronise the DP ranks of a stage (`dp_sync`); the grad-norm clip synchronises all
workers; embedding grads all-reduce joins the first and last stage of a DP rank. The transfer
duration of a call is its end minus the latest start among it and its peers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.whatif import trace as tr
from failslow.whatif.trace import OPTYPES, Kind, Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

IDEAL_METHODS = ("mean", "median")
EQUALISE = ("all", "stage")
ISSUE_EPS = 5e-5  # s: clock jitter allowed when inferring "issued after" from timestamps


@dataclass(frozen=True)
class Call:
    """Template nodes of one worker that start together and end together (one call of the program).

    A local op is a call of one node. A communication call ends at the latest start among itself
    and its `peers` (other calls; across the step's DP ranks too when `dp_sync`) plus its transfer
    time. A batched P2P call (e.g. Megatron's send_forward_recv_backward) holds several nodes, each
    with its own peer on an adjacent stage.
    """

    members: tuple[int, ...]
    is_comm: bool
    dp_sync: bool
    peers: tuple[int, ...]
    deps: tuple[int, ...]  # calls whose end this call's start waits for


@dataclass(frozen=True)
class Model:
    """Dependency model plus the trace's durations laid out per node and lane.

    Attributes:
        stage, optype, seq: per template node.
        simulated: False for P2P no-ops (a send/recv without a peer), left out of simulation.
        deps: per node, the nodes it waits for.
        calls: the calls (see `Call`); `node_call` maps a node to its call.
        events: a topological order of call events, `2*c` = start of call c, `2*c+1` = its end.
        sinks: calls nothing waits for (the step ends when the last of them ends).
        work: (N, dp, steps) original duration (compute) or transfer duration (communication).
        ideal: (N,) idealised work: per optype mean duration (compute) / median transfer (comm).
        start, end: (N, dp, steps) the trace's timestamps of every node instance.
        gmc, mb: (N,) model chunk (in the whole model) and micro-batch of compute nodes, else -1.
        delay: (N, dp, steps) launch delay of the node's call: its start minus the latest end of
            what it waits for (untraced CPU work; the step start for calls that wait for nothing).
        ideal_delay: (N,) per op type median of `delay`.
        ideal_key, delay_key: which nodes share an ideal (see `idealise`); compute: "mean"/"median".
        p2p_peer: (N,) the matching send/recv on the adjacent stage of a P2P node, else -1.
        n_noops: P2P operations without a peer (not simulated).
    """

    trace: Trace
    stage: IntArray
    optype: IntArray
    seq: IntArray
    simulated: npt.NDArray[np.bool_]
    deps: tuple[tuple[int, ...], ...]
    calls: tuple[Call, ...]
    node_call: IntArray
    events: tuple[int, ...]
    sinks: tuple[int, ...]
    work: FloatArray
    ideal: FloatArray
    start: FloatArray
    end: FloatArray
    gmc: IntArray
    mb: IntArray
    delay: FloatArray
    ideal_delay: FloatArray
    p2p_peer: IntArray
    n_noops: int
    ideal_key: IntArray  # (N,) nodes sharing a key share one ideal work
    delay_key: IntArray  # (N,) the same for launch delays
    compute: str  # how compute work is idealised ("mean" or "median")

    @property
    def n_nodes(self) -> int:
        """Template size: operations of one DP rank (all stages) in one step."""
        return int(self.stage.shape[0])

    @property
    def dp(self) -> int:
        """Number of DP ranks (lanes per step)."""
        return int(self.work.shape[1])

    @property
    def n_steps(self) -> int:
        """Number of steps in the trace."""
        return int(self.work.shape[2])


def _dense(trace: Trace) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray]:
    """Node ids and lanes for every row; checks every (dp, step) holds every node of the template."""
    n_types = len(OPTYPES)
    seq_span = int(trace.seq_id.max()) + 1
    key = (trace.stage * n_types + trace.optype) * seq_span + trace.seq_id
    ukey, node = np.unique(key, return_inverse=True)
    node = node.reshape(-1)
    n_nodes = int(ukey.shape[0])
    dp, n_steps = trace.meta.dp_size, trace.n_steps
    lane = trace.dp_rank * n_steps + trace.step_index
    n_lanes = dp * n_steps
    cell = node * n_lanes + lane
    counts = np.bincount(cell, minlength=n_nodes * n_lanes)
    if np.any(counts != 1):
        bad = int(np.flatnonzero(counts != 1)[0])
        v, ln = divmod(bad, n_lanes)
        d, s = divmod(ln, n_steps)
        k = int(ukey[v])
        seq = k % seq_span
        st, ot = divmod(k // seq_span, n_types)
        what = "missing" if counts[bad] == 0 else f"recorded {int(counts[bad])} times"
        raise InputError(
            f"inconsistent trace: {OPTYPES[ot].name} seq_id={seq} of stage {st} is {what} at dp_rank {d}, "
            f"step {int(trace.step_ids[s])} (every step and DP rank must record the same operations)")
    stage = (ukey // seq_span) // n_types
    optype = (ukey // seq_span) % n_types
    seq = ukey % seq_span
    return node, cell, stage.astype(np.int64), optype.astype(np.int64), seq.astype(np.int64)


def _lane_constant(name: str, values: IntArray, n_nodes: int, n_lanes: int, cell: IntArray) -> IntArray:
    flat = np.empty(n_nodes * n_lanes, dtype=np.int64)
    flat[cell] = values
    grid = flat.reshape(n_nodes, n_lanes)
    if np.any(grid != grid[:, :1]):
        v = int(np.flatnonzero(np.any(grid != grid[:, :1], axis=1))[0])
        raise InputError(f"inconsistent trace: column {name} of an operation differs between steps/DP ranks "
                         f"(template node {v})")
    return grid[:, 0].copy()


def build_model(trace: Trace, compute: str = "mean", equalise: str = "all") -> Model:
    """Build the dependency model of a validated trace; `InputError` when it cannot be modelled.

    Args:
        trace: a validated trace.
        compute: how compute ops are idealised, "mean" (the what-if study's definition) or
            "median" (robust when stragglers are a large share of a small job's workers).
        equalise: which ops one ideal duration is shared by: "all" of an op type (the study's
            definition: stage partitioning imbalance counts as straggling) or those of one op type
            on one "stage" (only DP ranks and steps are equalised; stage imbalance is kept).
    """
    if equalise not in EQUALISE:
        raise InputError(f"unknown equalisation {equalise!r}; choose one of {EQUALISE}")
    if compute not in IDEAL_METHODS:
        raise InputError(f"unknown idealisation {compute!r}; choose one of {IDEAL_METHODS}")
    meta = trace.meta
    _node, cell, stage, optype, seq = _dense(trace)
    n_nodes = int(stage.shape[0])
    dp, n_steps = meta.dp_size, trace.n_steps
    n_lanes = dp * n_steps
    flat = np.empty(n_nodes * n_lanes)
    flat[cell] = trace.start
    start = flat.reshape(n_nodes, dp, n_steps)
    flat = np.empty(n_nodes * n_lanes)
    flat[cell] = trace.duration
    dur = flat.reshape(n_nodes, dp, n_steps)
    end = start + dur
    mc = _lane_constant("mc", trace.mc, n_nodes, n_lanes, cell)
    gmc = _lane_constant("gmc", trace.gmc, n_nodes, n_lanes, cell)
    mb = _lane_constant("mb_id", trace.mb_id, n_nodes, n_lanes, cell)
    # step-relative times of the template, robust to a few odd lanes
    t_start = np.median(start.reshape(n_nodes, -1), axis=1)
    t_end = np.median(end.reshape(n_nodes, -1), axis=1)

    kind = np.array([OPTYPES[o].kind for o in optype.tolist()], dtype=np.int64)
    deps: list[list[int]] = [[] for _ in range(n_nodes)]
    simulated = np.ones(n_nodes, dtype=bool)
    call_members: list[list[int]] = []
    call_flags: list[tuple[bool, bool]] = []  # is_comm, dp_sync
    node_call = np.full(n_nodes, -1, dtype=np.int64)

    def add_call(mem: list[int], is_comm: bool, sync: bool) -> int:
        call_members.append(mem)
        call_flags.append((is_comm, sync))
        node_call[mem] = len(call_members) - 1
        return len(call_members) - 1

    pp = meta.pp_size
    n_chunks = pp * meta.vpp_size
    sends: dict[tuple[int, int], list[int]] = {}  # (src stage, direction) -> send nodes in order
    recvs: dict[tuple[int, int], list[int]] = {}  # (dst stage, direction) -> recv nodes in order

    for s in range(pp):
        on_stage = np.flatnonzero(stage == s)
        if on_stage.size == 0:
            continue
        main = on_stage[np.isin(kind[on_stage], (Kind.COMPUTE, Kind.MAIN_COLL))]
        main = main[np.lexsort((seq[main], t_end[main], t_start[main]))]
        main_end = t_end[main]
        main_list = main.tolist()
        for a, b in itertools.pairwise(main_list):
            deps[b].append(a)

        dpc = on_stage[kind[on_stage] == Kind.DP_COLL]
        dpc = dpc[np.lexsort((seq[dpc], t_end[dpc], t_start[dpc]))].tolist()
        dpc_end = t_end[dpc] if dpc else np.zeros(0)
        main_start = t_start[main]

        def issued_after(v: int, _main_end: FloatArray = main_end, _main: list[int] = main_list,
                         _dpc_end: FloatArray = dpc_end, _dpc: list[int] = dpc) -> list[int]:
            # The CPU issues calls in program order: an op waits for the last main-stream op and
            # the last DP collective that ended before it started.
            out = []
            before = np.flatnonzero(_main_end <= t_start[v] + ISSUE_EPS)
            if before.size:
                out.append(_main[int(before[-1])])
            before = np.flatnonzero(_dpc_end <= t_start[v] + ISSUE_EPS)
            if before.size and _dpc[int(before[-1])] != v:
                out.append(_dpc[int(before[-1])])
            return out

        dpc_start = t_start[dpc] if dpc else np.zeros(0)

        def block(v: int, _main_start: FloatArray = main_start, _main: list[int] = main_list,
                  _dpc_start: FloatArray = dpc_start, _dpc: list[int] = dpc) -> None:
            # Blocking calls: the next main-stream op, issued after this call, started only after it
            # ended, so it waits for it (fused send/recv, synchronous all-gather ...).
            after = np.flatnonzero(_main_start >= t_start[v] - ISSUE_EPS)
            if after.size:
                nxt = _main[int(after[0])]
                if t_start[nxt] >= t_end[v] - ISSUE_EPS:
                    deps[nxt].append(v)
                    # A blocking call holds the issuing thread, so the next DP collective issued
                    # after it waits for it too: on a synchronous (CPU) worker a send blocked on a
                    # slow peer delays the gradient all-reduce that follows, and without this edge
                    # the wait would be booked as the all-reduce's own launch gap.
                    if Kind(kind[v]) == Kind.P2P:
                        later = np.flatnonzero(_dpc_start >= t_end[v] - ISSUE_EPS)
                        if later.size and _dpc[int(later[0])] != v:
                            deps[_dpc[int(later[0])]].append(v)

        comp_gmc = {}
        for v in main_list:
            if optype[v] in (tr.FWD, tr.BWD):
                # Megatron places model chunk mc of stage s at position mc*pp + s of the model;
                # derive it from mc (some producers fill gmc with other ids) and fall back to gmc
                fallback = int(gmc[v]) if gmc[v] >= 0 else s
                comp_gmc[v] = int(mc[v]) * pp + s if mc[v] >= 0 else fallback
        fwd = [v for v in main_list if optype[v] == tr.FWD]
        bwd = [v for v in main_list if optype[v] == tr.BWD]

        # --- P2P: match each send/recv with its compute op, chain the four streams
        need_fns: tuple[tuple[int, list[int], Callable[[int], bool], bool, int], ...] = (
            (tr.FSEND, fwd, lambda g: g < n_chunks - 1, True, 0),
            (tr.FRECV, fwd, lambda g: g > 0, False, 0),
            (tr.BSEND, bwd, lambda g: g > 0, True, 1),
            (tr.BRECV, bwd, lambda g: g < n_chunks - 1, False, 1),
        )
        for ot, comps, need_fn, is_send, direction in need_fns:
            comm = on_stage[optype[on_stage] == ot]
            comm = comm[np.argsort(seq[comm], kind="stable")].tolist()
            for a, b in itertools.pairwise(comm):
                deps[b].append(a)
            need = [need_fn(comp_gmc[c]) for c in comps]
            n_need = sum(need)
            if len(comm) == n_need:
                matched = [c for c, nd in zip(comps, need, strict=True) if nd]
                noop = [False] * len(comm)
            elif len(comm) == len(comps):
                matched = list(comps)
                noop = [not nd for nd in need]
            else:
                raise InputError(
                    f"inconsistent trace: stage {s} has {len(comm)} {OPTYPES[ot].name} op(s) per step but "
                    f"{n_need} of its {len(comps)} {'forward' if direction == 0 else 'backward'} computes "
                    f"need one (pp={pp}, vpp={meta.vpp_size}); check the metadata")
            for v, c, nop in zip(comm, matched, noop, strict=True):
                if nop:
                    simulated[v] = False
                    continue
                if is_send:
                    deps[v].append(c)
                else:
                    deps[c].append(v)
                for issue in issued_after(v):
                    if issue != c:
                        deps[v].append(issue)
                    elif not is_send:
                        # a receive cannot wait for the compute that consumes it (overlapping
                        # timestamps): it waits for the compute's predecessor instead
                        i = main_list.index(c)
                        if i > 0:
                            deps[v].append(main_list[i - 1])
                block(v)
                if is_send:
                    sends.setdefault((s, direction), []).append(v)
                else:
                    src = (s - 1) % pp if direction == 0 else (s + 1) % pp
                    recvs.setdefault((src, direction), []).append(v)

        # --- DP stream
        for a, b in itertools.pairwise(dpc):
            deps[b].append(a)
        opt_phase = [v for v in main_list if optype[v] in (tr.CLIP, tr.OPTIMIZER)]
        for v in dpc:
            deps[v].extend(issued_after(v))
            block(v)
            if optype[v] == tr.PARAMS_AG:
                chunk = [c for c in fwd if mc[v] < 0 or mc[c] == mc[v] or mc[c] < 0]
                if chunk and v not in deps[chunk[0]]:
                    deps[chunk[0]].append(v)
            elif opt_phase:
                deps[opt_phase[0]].append(v)
            add_call([v], True, dp > 1)

        # --- main-stream collectives local to our model (TP group not traced)
        for v in main_list:
            if optype[v] == tr.LAYERNORM_AR:
                add_call([v], True, False)

    # P2P pairs per channel, FIFO
    pairs: list[tuple[int, int]] = []
    for (src, direction), snd in sends.items():
        rcv = recvs.get((src, direction), [])
        if len(rcv) != len(snd):
            dst = (src + 1) % pp if direction == 0 else (src - 1) % pp
            name = "forward" if direction == 0 else "backward"
            raise InputError(f"inconsistent trace: stage {src} sends {len(snd)} {name} activations per step to "
                             f"stage {dst}, which receives {len(rcv)}")
        pairs.extend(zip(snd, rcv, strict=True))
    for (src, direction), rcv in recvs.items():
        if (src, direction) not in sends:
            raise InputError(f"inconsistent trace: stage {(src + 1) % pp if direction == 0 else (src - 1) % pp} "
                             f"receives {len(rcv)} activations per step from stage {src}, which sends none")
    # A batched (fused) P2P call - e.g. Megatron's send_forward_recv_backward - records its sends and
    # receives with one start and one end: it completes when the peers of all its parts have started.
    p2p = np.array(sorted({v for pr in pairs for v in pr}), dtype=np.int64)
    if p2p.size:
        order = p2p[np.lexsort((t_end[p2p], t_start[p2p], stage[p2p]))].tolist()
        cluster = [order[0]]
        for a, b in itertools.pairwise(order):
            if stage[a] == stage[b] and abs(t_start[a] - t_start[b]) <= ISSUE_EPS \
                    and abs(t_end[a] - t_end[b]) <= ISSUE_EPS:
                cluster.append(b)
            else:
                add_call(cluster, True, False)
                cluster = [b]
        add_call(cluster, True, False)
    p2p_peer = np.full(n_nodes, -1, dtype=np.int64)
    for a, b in pairs:
        p2p_peer[a], p2p_peer[b] = b, a
    peer_sets: dict[int, set[int]] = {}
    for a, b in pairs:
        ca, cb = int(node_call[a]), int(node_call[b])
        peer_sets.setdefault(ca, set()).add(cb)
        peer_sets.setdefault(cb, set()).add(ca)

    # embedding grads (first + last stage of a DP rank) and grad-norm clip (everyone), matched by seq
    for ot in (tr.EMBEDDING_AR, tr.CLIP):
        nodes = np.flatnonzero(optype == ot)
        for q in np.unique(seq[nodes]).tolist():
            cids = [add_call([v], True, ot == tr.CLIP and dp > 1) for v in nodes[seq[nodes] == q].tolist()]
            for c in cids:
                peer_sets[c] = set(cids) - {c}
    for v in range(n_nodes):
        if node_call[v] < 0 and simulated[v]:
            add_call([v], False, False)

    # drop edges to/from no-ops (they carry no data) and duplicates
    deps_t = [tuple(dict.fromkeys(d for d in deps[v] if simulated[d])) for v in range(n_nodes)]
    calls = []
    for c, mem in enumerate(call_members):
        cdeps = {int(node_call[d]) for v in mem for d in deps_t[v]} - {c}
        calls.append(Call(tuple(mem), call_flags[c][0], call_flags[c][1],
                          tuple(sorted(peer_sets.get(c, ()))), tuple(sorted(cdeps))))
    events = _toposort(calls, node_call)

    # transfer durations: the call's end minus the latest start among it and its peers
    work = dur.copy()
    for call in calls:
        if not call.is_comm:
            continue
        mem = list(call.members)
        others = [v for p in call.peers for v in calls[p].members]
        latest = start[mem + others].max(axis=0)
        if call.dp_sync:
            latest = latest.max(axis=0, keepdims=True)
        work[mem] = np.maximum(end[mem].max(axis=0) - latest, 0.0)

    key = optype if equalise == "all" else optype * (pp + 1) + stage
    ideal = idealise(work, key, optype, simulated, compute)

    # launch delays: how much later a call started than its dependencies allowed
    delay = np.zeros_like(work)
    call_end = [end[list(c.members)].max(axis=0) for c in calls]
    for call in calls:
        mem = list(call.members)
        ready = np.zeros((dp, n_steps))
        for d in call.deps:
            ready = np.maximum(ready, call_end[d])
        delay[mem] = np.maximum(start[mem].min(axis=0) - ready, 0.0)
    ideal_delay = idealise(delay, key, optype, simulated, "median")

    consumed = np.zeros(len(calls), dtype=bool)
    for call in calls:
        consumed[list(call.deps)] = True
    sinks = tuple(int(c) for c in np.flatnonzero(~consumed))
    return Model(trace=trace, stage=stage, optype=optype, seq=seq, simulated=simulated, deps=tuple(deps_t),
                 calls=tuple(calls), node_call=node_call, events=events, sinks=sinks, work=work, ideal=ideal, start=start, end=end,
                 gmc=gmc, mb=mb, delay=delay, ideal_delay=ideal_delay, p2p_peer=p2p_peer, n_noops=int((~simulated).sum()),
                 ideal_key=key, delay_key=key, compute=compute)


def idealise(work: FloatArray, key: IntArray, optype: IntArray, simulated: npt.NDArray[np.bool_],
             compute: str = "mean", exclude: npt.NDArray[np.bool_] | None = None) -> FloatArray:
    """Idealised work per node: over the nodes sharing a `key` (op type, or op type and stage), the
    mean (or median) duration of compute ops and the median transfer of communication ops.

    `exclude` (nodes, dp) leaves those instances out of the statistics (e.g. a straggler's own
    operations when asking how fast it would be if it behaved like the others); a key whose every
    instance is excluded falls back to all of them.
    """
    ideal = np.zeros(optype.shape[0])
    for k in np.unique(key).tolist():
        sel = (key == k) & simulated
        if not sel.any():
            continue
        vals = work[sel]
        if exclude is not None:
            keep = ~exclude[sel]
            if keep.any():
                vals = vals[keep]
        o = int(optype[np.argmax(sel)])
        use_median = OPTYPES[o].is_comm or compute == "median"
        ideal[sel] = float(np.median(vals)) if use_median else float(vals.mean())
    return ideal


def _toposort(calls: list[Call], node_call: IntArray) -> tuple[int, ...]:
    """Order call events: a start after the ends of its dependencies, an end after its own start and
    its peers' starts. A cycle means the trace's order contradicts itself."""
    n = 2 * len(calls)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for c, call in enumerate(calls):
        for d in call.deps:
            succ[2 * d + 1].append(2 * c)
        indeg[2 * c] = len(call.deps)
        for p in (c, *call.peers):
            succ[2 * p].append(2 * c + 1)
        indeg[2 * c + 1] = 1 + len(call.peers)
    ready = [e for e in range(n) if indeg[e] == 0]
    order: list[int] = []
    while ready:
        e = ready.pop()
        order.append(e)
        for f in succ[e]:
            indeg[f] -= 1
            if indeg[f] == 0:
                ready.append(f)
    if len(order) != n:
        stuck = [calls[e // 2].members for e in range(n) if indeg[e] > 0][:3]
        raise InputError("inconsistent trace: the operations' order implies a dependency cycle "
                         f"(e.g. around template nodes {stuck})")
    return tuple(order)
