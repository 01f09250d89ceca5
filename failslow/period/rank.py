"""One rank's call stream turned into iterations, as the exporter sees it live.

A `RankTrack` follows one ring (one process of the NCCL shim or the torch hook): it feeds the calls to a
streaming `PeriodTracker`, which finds the iterations without knowing the framework, splits each iteration
into time inside and outside communication calls (a straggler computes longer and waits less; a slow link
makes everyone wait), measures the compute outside the pipeline (`outside_pipeline_s`), keeps per-communicator
totals, and infers the rank's place in the parallel layout
from its communicators when the ring's header does not say. The exporter only maps these to metrics.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.tracker import PeriodTracker
from failslow.record import CALL_OPS, Flag, Op, RingHeader, RingReader
from failslow.topology import Layout, ObservedComm, group_kind, infer_layout

_P2P = (int(Op.SEND), int(Op.RECV))
_COMM_INIT = int(Op.COMM_INIT)
_CALL_OPS = np.array(sorted(CALL_OPS), dtype=np.uint16)


@dataclass
class CommMeta:
    """What a rank's records say about one of its communicators."""

    nranks: int
    comm_rank: int
    collective: bool = False
    peers: set[int] = field(default_factory=set)


@dataclass
class CommStats:
    """Running totals of one (communicator, op) of one rank."""

    calls: int = 0
    nbytes: int = 0
    dur_sum: float = 0.0
    dur_count: int = 0


class RankTrack:
    """What one ring (one process, usually one rank) says: its iterations, their split into time inside and
    outside calls, its communicators and per-communicator totals, and its place in the parallel layout.

    Feed it with :meth:`poll` (reads the records committed since the last call) or :meth:`ingest`.
    """

    def __init__(self, path: Path, reader: RingReader, *, window: int, buffer: int, node: str = "") -> None:
        """Start following ``reader``'s ring."""
        self.path = path
        self.reader = reader
        self.header: RingHeader = reader.header
        self.ident = (os.stat(path).st_ino, self.header.created_mono_ns, self.header.pid)
        # Ring times are nanosecond clock reads and the torch hook gives the calls of one batch_isend_irecv
        # one start time: "issued together" is exact call structure here (see PeriodTracker.together).
        self.tracker = PeriodTracker(buffer=buffer, window=window, together=True)
        self.window = window
        self.buffer = buffer
        self.node = str(self.header.node_id) if self.header.node_id >= 0 else node
        self.comms: dict[int, CommMeta] = {}
        self.stats: dict[tuple[int, int], CommStats] = {}
        self.layout: Layout | None = self._header_layout()
        self._inferred_from = 0  # comms seen when the layout was last inferred
        self._base_ns = self.header.created_mono_ns
        self._last_raw_seq: int | None = None
        self._synth = 0
        # call start times and cumulative time-in-calls, for the compute/comm split of iterations
        self._ct = np.empty(0)
        self._cb = np.empty(0)
        self._cp = np.empty(0, dtype=bool)  # whether each buffered call is a pipeline send/receive
        self._cc = np.empty(0, dtype=np.int64)
        self._cum = 0.0
        self._cover_end = [0, 0]  # latest call end seen (ns), host-timed and GPU-timed
        self.split: deque[tuple[float, float]] = deque(maxlen=window)
        #: Per iteration of `split`, the compute outside the pipeline (:meth:`_outside_pipeline`; NaN: none).
        self.outside: deque[float] = deque(maxlen=window)
        self.iterations_total = 0
        self.mean_iteration_s: float | None = None
        self.last_end_unix_s: float | None = None
        self.period: int | None = None
        #: Confidence in ``period``; below `CONFIDENCE_MIN` no period or iteration time is exposed.
        self.confidence = 0.0
        #: Every emitted iteration as (duration s, end Unix time s) when enabled (replay and tests).
        self.history: list[tuple[float, float]] | None = None

    def _header_layout(self) -> Layout | None:
        h = self.header
        sizes = [h.tp, h.pp, h.dp, h.cp or 1]
        if min(h.tp, h.pp, h.dp) <= 0 or h.world_size <= 0 or int(np.prod(sizes)) != h.world_size:
            return None
        try:
            return Layout(tp=h.tp, pp=h.pp, dp=h.dp, cp=h.cp or 1)
        except InputError:
            return None

    # --- ingest -----------------------------------------------------------------------------------

    def poll(self) -> int:
        """Read and digest the records committed since the last poll; returns how many."""
        lost_before = self.reader.lost
        recs = self.reader.read_new()
        self.header = self.reader.header
        if len(recs):
            self._ingest(recs, lost_jump=self.reader.lost - lost_before)
        return len(recs)

    def ingest(self, recs: npt.NDArray[Any], lost_jump: int = 0) -> None:
        """Digest records of this ring (seq ascending), e.g. a replay in chunks."""
        if len(recs):
            self._ingest(recs, lost_jump)

    def _ingest(self, recs: npt.NDArray[Any], lost_jump: int) -> None:
        op = recs["op"]
        seq = recs["seq"].astype(np.int64)
        if self._last_raw_seq is None and int(seq[0]) == 1:
            # The ring was read from its first record: the tracker sees where the first iteration
            # begins (after the set-up calls) and anchors iteration boundaries there.
            self.tracker.origin = True
        prev = self._last_raw_seq if self._last_raw_seq is not None else int(seq[0]) - 1 - lost_jump
        gaps = np.diff(np.concatenate(([prev], seq))) - 1  # records lost just before each record
        self._last_raw_seq = int(seq[-1])
        is_call = np.isin(op, _CALL_OPS)
        # A call-only sequence number that still jumps where records were lost (control events do not
        # count as calls), so the tracker restarts at holes but not at communicator set-up.
        inc = is_call.astype(np.int64) + np.maximum(gaps, 0)
        synth = self._synth + np.cumsum(inc)
        self._synth = int(synth[-1])

        init = recs[op == _COMM_INIT]
        for r in init:
            self.comms.setdefault(int(r["comm"]), CommMeta(int(r["nranks"]), int(r["comm_rank"])))
        calls = recs[is_call]
        if len(calls) == 0:
            return
        cseq = synth[is_call]
        comm = calls["comm"].astype(np.uint64)
        cop = calls["op"].astype(np.int64)
        t_ns = calls["t_enqueue_ns"].astype(np.int64)
        ts, te = calls["t_start_ns"].astype(np.int64), calls["t_end_ns"].astype(np.int64)
        has_dur = (ts > 0) & (te >= ts)
        dur = np.where(has_dur, (te - ts) * 1e-9, 0.0)
        self._comm_meta(calls, comm, cop)
        self._comm_stats(comm, cop, calls["bytes"].astype(np.int64), dur, has_dur)

        t = (t_ns - self._base_ns) * 1e-9
        self._ct = np.concatenate((self._ct, t))[-self.buffer:]
        gpu = (calls["flags"] & int(Flag.GPU_TIMES)) != 0
        inside = self._new_cover(ts, te, has_dur, gpu)
        csum = np.cumsum(inside)
        before = self._cum + csum - inside  # time inside calls before each call
        self._cum += float(csum[-1])
        self._cb = np.concatenate((self._cb, before))[-self.buffer:]
        p2p = np.isin(cop, _P2P)
        self._cp = np.concatenate((self._cp, p2p))[-self.buffer:]
        # the communicator of each collective (-1 for sends/receives), to tell the iteration's own collectives
        self._cc = np.concatenate((self._cc, np.where(p2p, -1, comm.view(np.int64))))[-self.buffer:]
        # End of each call as the tracker's iteration marker; host-timed ends only (GPU times live on
        # another clock domain mapping and may arrive late).
        host_end = has_dur & ~gpu
        t_end = np.where(host_end, (te - self._base_ns) * 1e-9, np.nan)
        # The peer is part of a call's identity: Send/Recv over one communicator alternate between the
        # previous and the next pipeline stage, and only the peer tells a micro-batch from an iteration.
        peer = calls["peer"].astype(np.int64)
        v = self.tracker.update(t, cop, comm.view(np.int64), calls["bytes"].astype(np.int64), peer, seq=cseq,
                                t_end=t_end, sync=~np.isin(cop, _P2P))
        self.period = v.period
        self.confidence = v.confidence
        self.iterations_total = v.iterations_total
        self.mean_iteration_s = v.mean_iteration_s
        if v.last_iteration_end_t is not None:
            wall_ns = self._base_ns + v.last_iteration_end_t * 1e9 + self.header.clock_offset_ns
            self.last_end_unix_s = wall_ns * 1e-9
        keep = 0
        if v.window_from is not None:
            # the tracker's mean restarted: iterations of a period never shown (one micro-batch of a stage
            # with many) must not hold the compute readings down for a window of real ones either
            self.split.clear()
            self.outside.clear()
            keep = v.window_from
        for k, (d, end) in enumerate(zip(v.iteration_s, v.iteration_end_t, strict=True)):
            if k >= keep:
                self.split.append((float(d), self._comm_time(end - d, end)))
                self.outside.append(self._outside_pipeline(end - d, end))
            if self.history is not None:
                wall = (self._base_ns + end * 1e9 + self.header.clock_offset_ns) * 1e-9
                self.history.append((float(d), float(wall)))

    def _new_cover(self, ts: npt.NDArray[np.int64], te: npt.NDArray[np.int64], has_dur: npt.NDArray[np.bool_],
                   gpu: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        """Per call, the part of its ``[t_start, t_end]`` that no earlier call of the ring covered (seconds).

        Summed over an iteration, that is the time the rank spent inside at least one call. The calls of one
        ``batch_isend_irecv`` (a pipeline stage's send and receive) are issued together and overlap: summing
        their durations counted the wait twice (over the last minute of a testbed run with two slowed stages, a
        healthy stage-1 rank spent 18 % of its time outside calls by the sum of durations, 47 % by their
        union). Host-timed and GPU-timed calls are on different clocks and are covered separately.
        """
        out = np.zeros(ts.shape[0])
        for dom, mask in enumerate((has_dur & ~gpu, has_dur & gpu)):
            if not mask.any():
                continue
            a, b = ts[mask], te[mask]
            prev = np.maximum.accumulate(np.concatenate(([self._cover_end[dom]], b)))[:-1]
            out[mask] = np.maximum(b - np.maximum(a, prev), 0) * 1e-9
            self._cover_end[dom] = max(self._cover_end[dom], int(b.max()))
        return out

    def _comm_time(self, start: float, end: float) -> float:
        """Time inside calls that started in ``[start, end)``, clipped to the iteration."""
        i0, i1 = np.searchsorted(self._ct, [start, end], side="left")
        a = self._cb[i0] if i0 < len(self._cb) else self._cum
        b = self._cb[i1] if i1 < len(self._cb) else self._cum
        return float(min(max(b - a, 0.0), end - start))

    def _outside_pipeline(self, start: float, end: float) -> float:
        """Compute time of the iteration in ``[start, end)`` outside its pipeline (NaN when it cannot be told).

        A pipeline stage's compute per iteration is its micro-batches' forwards and backwards, which scale with
        the micro-batches it runs, plus work done once per iteration (gradient copies, optimizer step, data and
        host work), which does not. The once-per-iteration work sits in the stretch between two consecutive
        pipeline sends/receives that holds the iteration's own collectives: from the last transfer of one
        iteration, across the gradient all-reduce (and the loss or gradient-norm reductions), to the first
        transfer of the next. That stretch is the one holding a call on a communicator that no other stretch of
        the iteration uses (tensor-parallel all-reduces come with every micro-batch, so they mark none). The
        stretches are taken where they end, inside this iteration, so the one that wraps around the boundary
        counts whatever the phase of the boundaries. What is returned is the compute in it: its length less
        the time inside any call. On a middle or last stage that is the once-per-iteration work; a first
        stage's stretch also holds one micro-batch's backward (before the all-reduce) and the next one's
        forward (before its first send). NaN: no sends/receives in the iteration (no pipeline), no collective
        of its own (a pipeline without data parallelism), or several stretches with one (e.g. gradient
        buckets reduced while the last backwards run).
        """
        i0, i1 = np.searchsorted(self._ct, [start, end], side="left")
        lo = max(0, 2 * int(i0) - int(i1))  # one iteration back holds the transfer before the window's first
        pipe = np.flatnonzero(self._cp[lo:i1]) + lo
        if len(pipe) == 0:
            return math.nan
        ends = pipe[(pipe >= i0) & (pipe > pipe[0])]  # each with a transfer before it in the buffer
        if len(ends) < 2:
            return math.nan
        opens = pipe[np.searchsorted(pipe, ends) - 1]
        users: dict[int, set[int]] = {}
        for n, (k, j) in enumerate(zip(opens.tolist(), ends.tolist(), strict=True)):
            for c in self._cc[k + 1:j].tolist():
                users.setdefault(c, set()).add(n)
        own = {next(iter(ns)) for ns in users.values() if len(ns) == 1}
        if len(own) != 1:
            return math.nan
        n = own.pop()
        k, j = int(opens[n]), int(ends[n])
        inside = self._cb[j] - self._cb[k]  # j < i1 <= len: a call of the buffer
        return float(max(0.0, self._ct[j] - self._ct[k] - inside))

    @property
    def outside_pipeline_s(self) -> float | None:
        """Mean compute outside the pipeline per iteration over the window (:meth:`_outside_pipeline`), over
        the iterations where it could be told (an iteration with a validation's extra calls may not); None
        unless that is at least half of the window's."""
        vals = np.asarray(self.outside, dtype=np.float64)
        ok = vals[np.isfinite(vals)]
        if len(ok) == 0 or 2 * len(ok) < len(vals):
            return None
        return float(ok.mean())

    def _comm_meta(self, calls: npt.NDArray[Any], comm: npt.NDArray[np.uint64], cop: npt.NDArray[np.int64]) -> None:
        uniq, first = np.unique(comm, return_index=True)
        for c, i in zip(uniq.tolist(), first.tolist(), strict=True):
            if c not in self.comms:
                self.comms[c] = CommMeta(int(calls["nranks"][i]), int(calls["comm_rank"][i]))
        p2p = np.isin(cop, _P2P)
        for c in np.unique(comm[~p2p]).tolist():
            self.comms[c].collective = True
        if p2p.any():
            for c, peer in set(zip(comm[p2p].tolist(), calls["peer"][p2p].tolist(), strict=True)):
                if peer >= 0:
                    self.comms[c].peers.add(int(peer))
        n = len(self.comms)
        if self.layout is None and n != self._inferred_from:
            self._inferred_from = n
            self.layout = self._infer_layout()

    def _infer_layout(self) -> Layout | None:
        h = self.header
        if h.world_size <= 0 or not 0 <= h.rank < h.world_size:
            return None
        obs = [ObservedComm(m.nranks, m.comm_rank, m.collective, tuple(sorted(m.peers)))
               for m in self.comms.values()]
        try:
            return infer_layout(h.world_size, h.rank, obs)
        except InputError:
            return None

    def _comm_stats(self, comm: npt.NDArray[np.uint64], cop: npt.NDArray[np.int64], nbytes: npt.NDArray[np.int64],
                    dur: npt.NDArray[np.float64], has_dur: npt.NDArray[np.bool_]) -> None:
        # One 1-D key per (communicator, op): np.unique over rows (axis=0) sorts structured rows and cost
        # more than all the period inference of a 10k-record read.
        ucomm, cinv = np.unique(comm, return_inverse=True)
        span = int(cop.max()) + 1
        ukey, inv = np.unique(cinv.reshape(-1).astype(np.int64) * span + cop, return_inverse=True)
        inv = inv.reshape(-1)
        uniq = np.stack([ucomm[ukey // span].view(np.int64), ukey % span], axis=1)
        k = len(uniq)
        calls = np.bincount(inv, minlength=k)
        nb = np.bincount(inv, weights=nbytes.astype(np.float64), minlength=k)
        ds = np.bincount(inv, weights=dur, minlength=k)
        dc = np.bincount(inv, weights=has_dur.astype(np.float64), minlength=k)
        for j, (c, o) in enumerate(uniq.tolist()):
            st = self.stats.setdefault((int(np.int64(c).view(np.uint64)), int(o)), CommStats())
            st.calls += int(calls[j])
            st.nbytes += int(nb[j])
            st.dur_sum += float(ds[j])
            st.dur_count += int(dc[j])

    # --- what the records say about the rank ------------------------------------------------------

    def dropped(self) -> int:
        """Records lost for this ring: given up by the writer plus overwritten before being read."""
        return int(self.header.dropped) + int(self.reader.lost)

    def group_of(self, comm: int) -> str:
        """Parallel group kind of one of this rank's communicators."""
        m = self.comms[comm]
        h = self.header
        if self.layout is not None and 0 <= h.rank < self.layout.world_size:
            return group_kind(self.layout, h.rank, ObservedComm(m.nranks, m.comm_rank, m.collective,
                                                                tuple(sorted(m.peers))))
        if h.world_size > 0 and m.nranks == h.world_size:
            return "world"
        return "p2p" if m.peers and not m.collective else "unknown"

    def close(self) -> None:
        """Stop following the ring."""
        self.reader.close()


def replay_ring(path: Path, *, chunk: int = 256, window: int = 20, buffer: int = 8192,
                node: str = "") -> RankTrack:
    """Feed a ring's records (e.g. kept after the job ended) through a `RankTrack`, as the exporter reads it live.

    Records are fed in ``chunk``-sized batches, as successive polls would see them; the returned
    track's ``history`` lists every iteration emitted. Used by the accuracy bench and tests.
    """
    reader = RingReader(path, pending_timeout_s=0.0)
    tr = RankTrack(Path(path), reader, window=window, buffer=buffer, node=node)
    tr.history = []
    recs = reader.read_new()
    for i in range(0, len(recs), chunk):
        tr.ingest(recs[i:i + chunk])
    return tr
