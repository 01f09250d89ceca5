"""Ring collector: per-rank iteration times and per-communicator call statistics from the call rings.

Every process tracked by the NCCL shim or the torch hook owns one ring file in the ring directory.
On each poll this collector opens rings of new processes, reads the records committed since the last
poll, and feeds each rank's call stream to a streaming `failslow.period.PeriodTracker`, which turns it
into iterations without knowing the framework. Rings of processes that have exited are read one
last time and their series dropped.

Exposed per rank (labels job, rank, dp_rank, pp_rank, tp_rank, node): mean iteration time over the
last window, iterations completed, the wall time of the last iteration end (hang detection), calls
per iteration, and the split of an iteration into time inside and outside communication calls (a
straggler computes longer and waits less; a slow link makes everyone wait). Per rank and
communicator: calls, bytes and time inside calls as counters and a summary, and one info series
naming the parallel group the communicator was matched to, so the detector can compare the ranks
of one group.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client.core import Metric

from exporter.collector import family
from exporter.settings import Settings
from failslow.errors import InputError
from failslow.period import CONFIDENCE_MIN, PeriodTracker
from failslow.record import CALL_OPS, OP_NAMES, Flag, Op, RingHeader, RingReader, find_rings, process_alive
from failslow.topology import Coords, Layout, ObservedComm, group_kind, infer_layout

log = logging.getLogger("failslow.exporter.ring")

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
    """Everything the exporter keeps about one ring (one process, usually one rank)."""

    def __init__(self, path: Path, reader: RingReader, *, window: int, buffer: int, node: str) -> None:
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
        self._cum = 0.0
        self.split: deque[tuple[float, float]] = deque(maxlen=window)
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
        csum = np.cumsum(dur)
        before = self._cum + csum - dur  # time inside calls before each call
        self._cum += float(csum[-1])
        self._cb = np.concatenate((self._cb, before))[-self.buffer:]
        # End of each call as the tracker's iteration marker; host-timed ends only (GPU times live on
        # another clock domain mapping and may arrive late).
        host_end = has_dur & ((calls["flags"] & int(Flag.GPU_TIMES)) == 0)
        t_end = np.where(host_end, (te - self._base_ns) * 1e-9, np.nan)
        # The peer is part of a call's identity: Send/Recv over one communicator alternate between the
        # previous and the next pipeline stage, and only the peer tells a micro-batch from an iteration.
        peer = calls["peer"].astype(np.int64)
        v = self.tracker.update(t, cop, comm.view(np.int64), calls["bytes"].astype(np.int64), peer, seq=cseq,
                                t_end=t_end)
        self.period = v.period
        self.confidence = v.confidence
        self.iterations_total = v.iterations_total
        self.mean_iteration_s = v.mean_iteration_s
        if v.last_iteration_end_t is not None:
            wall_ns = self._base_ns + v.last_iteration_end_t * 1e9 + self.header.clock_offset_ns
            self.last_end_unix_s = wall_ns * 1e-9
        for d, end in zip(v.iteration_s, v.iteration_end_t, strict=True):
            self.split.append((float(d), self._comm_time(end - d, end)))
            if self.history is not None:
                wall = (self._base_ns + end * 1e9 + self.header.clock_offset_ns) * 1e-9
                self.history.append((float(d), float(wall)))

    def _comm_time(self, start: float, end: float) -> float:
        """Time inside calls that started in ``[start, end)``, clipped to the iteration."""
        i0, i1 = np.searchsorted(self._ct, [start, end], side="left")
        a = self._cb[i0] if i0 < len(self._cb) else self._cum
        b = self._cb[i1] if i1 < len(self._cb) else self._cum
        return float(min(max(b - a, 0.0), end - start))

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

    # --- exposition -------------------------------------------------------------------------------

    def labels(self) -> list[str]:
        """Values of ``job, rank, dp_rank, pp_rank, tp_rank, node``."""
        h = self.header
        c: Coords | None = None
        if self.layout is not None and 0 <= h.rank < self.layout.world_size:
            c = self.layout.coords(h.rank)
        coord = [str(c.dp), str(c.pp), str(c.tp)] if c is not None else ["", "", ""]
        # An unknown rank is named after the process so that two such processes never share a series.
        rank = str(h.rank) if h.rank >= 0 else f"pid-{h.pid}"
        return [h.job or "unknown", rank, *coord, self.node]

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


class RingCollector:
    """Follows every ring in a directory and exposes what their call streams say."""

    def __init__(self, ring_dir: Path, *, node: str, window: int = 20, buffer: int = 8192,
                 alive: Callable[[int], bool] = process_alive) -> None:
        """Follow the rings in ``ring_dir``.

        Args:
            ring_dir: Directory of ``failslow-*.ring`` files.
            node: Node name for ranks whose ring does not name a node.
            window: Iterations per mean.
            buffer: Calls kept per ring for period inference.
            alive: Whether a producer process still runs (injected for tests).
        """
        self.ring_dir = Path(ring_dir)
        self.node = node
        self.window = window
        self.buffer = buffer
        self._alive = alive
        self._lock = threading.Lock()
        self.tracks: dict[Path, RankTrack] = {}
        self._dead: set[tuple[int, int]] = set()  # (inode, mtime_ns) of rings of exited processes

    def poll(self) -> int:
        """Discover rings, read new records, drop exited processes; returns records read."""
        with self._lock:
            return self._poll()

    def _poll(self) -> int:
        n = 0
        present = set(find_rings(self.ring_dir))
        for path in list(self.tracks):
            if path not in present or self._replaced(self.tracks[path]):
                self.tracks.pop(path).close()
        for path in present - set(self.tracks):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_ino, st.st_mtime_ns) in self._dead:
                continue
            try:
                reader = RingReader(path)
            except InputError as exc:  # being created, or not a ring: try again next poll
                log.debug("skipping %s: %s", path, exc)
                continue
            if not self._alive(reader.pid):
                # Exited before we ever saw it: nothing live to report.
                reader.close()
                self._dead.add((st.st_ino, st.st_mtime_ns))
                continue
            self.tracks[path] = RankTrack(path, reader, window=self.window, buffer=self.buffer, node=self.node)
        for path, tr in list(self.tracks.items()):
            try:
                n += tr.poll()
            except InputError as exc:
                log.warning("dropping ring %s: %s", path, exc)
                self.tracks.pop(path).close()
                continue
            if not self._alive(tr.header.pid):
                # The final records were just read; the process is gone, and so are its series.
                try:
                    st = os.stat(path)
                    self._dead.add((st.st_ino, st.st_mtime_ns))
                except OSError:
                    pass
                self.tracks.pop(path).close()
        return n

    @staticmethod
    def _replaced(tr: RankTrack) -> bool:
        try:
            return os.stat(tr.path).st_ino != tr.ident[0]
        except OSError:
            return True

    def collect(self) -> Iterator[Metric]:
        """Poll once, then expose every followed rank."""
        with self._lock:
            self._poll()
            yield from self._families()

    def _families(self) -> Iterator[Metric]:
        it_dur = family("failslow_iteration_duration_seconds")
        it_tot = family("failslow_iterations_total")
        last = family("failslow_last_iteration_timestamp_seconds")
        period = family("failslow_iteration_period_calls")
        conf = family("failslow_iteration_period_confidence_ratio")
        comm_s = family("failslow_iteration_comm_seconds")
        comp_s = family("failslow_iteration_compute_seconds")
        dropped = family("failslow_ring_dropped_records_total")
        calls = family("failslow_comm_calls_total")
        nbytes = family("failslow_comm_bytes_total")
        dur = family("failslow_comm_call_duration_seconds")
        info = family("failslow_comm_info")
        rings = family("failslow_exporter_rings")
        producers: dict[str, int] = {}
        # One process can have two rings (the NCCL shim and the torch hook): rank series come from one
        # of them (the shim's, else the one that found more iterations), counters are summed.
        by_rank: dict[tuple[str, str], list[RankTrack]] = {}
        for tr in self.tracks.values():
            lab = tr.labels()
            by_rank.setdefault((lab[0], lab[1]), []).append(tr)
            producers[tr.header.producer_name] = producers.get(tr.header.producer_name, 0) + 1
        comm_rows: dict[tuple[str, ...], list[float]] = {}
        info_rows: dict[tuple[str, ...], float] = {}
        for (job, rank), trs in sorted(by_rank.items()):
            main = max(trs, key=lambda t: (t.header.producer_name == "shim", t.iterations_total, -t.header.pid))
            lab = main.labels()
            it_tot.add_metric(lab, main.iterations_total)
            # No iteration time rather than a wrong one: a period the tracker is not confident in (e.g. a
            # fraction of the iteration, contradicted by the gaps between iterations) is not shown.
            sure = main.confidence >= CONFIDENCE_MIN
            if main.mean_iteration_s is not None and sure:
                it_dur.add_metric(lab, main.mean_iteration_s)
            if main.last_end_unix_s is not None:
                last.add_metric(lab, main.last_end_unix_s)
            if main.period is not None:
                conf.add_metric(lab, main.confidence)
            if main.period is not None and sure:
                period.add_metric(lab, main.period)
            if main.split and sure:
                arr = np.asarray(main.split)
                c = float(arr[:, 1].mean())
                comm_s.add_metric(lab, c)
                comp_s.add_metric(lab, float(arr[:, 0].mean()) - c)
            dropped.add_metric([job, rank], sum(t.dropped() for t in trs))
            for tr in trs:
                for (comm, op), st in tr.stats.items():
                    meta = tr.comms.get(comm)
                    key = (job, rank, f"{comm:016x}", OP_NAMES.get(op, f"Op{op}"), str(meta.nranks if meta else 0))
                    row = comm_rows.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                    row[0] += st.calls
                    row[1] += st.nbytes
                    row[2] += st.dur_count
                    row[3] += st.dur_sum
                for comm, meta in tr.comms.items():
                    info_rows[(job, rank, f"{comm:016x}", str(meta.nranks), str(meta.comm_rank),
                               tr.group_of(comm))] = 1.0
        for key, (n, b, dc, ds) in sorted(comm_rows.items()):
            calls.add_metric(list(key), n)
            nbytes.add_metric(list(key), b)
            dur.add_metric(list(key), count_value=dc, sum_value=ds)
        for key, v in sorted(info_rows.items()):
            info.add_metric(list(key), v)
        for prod, k in sorted(producers.items()):
            rings.add_metric([prod], k)
        yield from (it_dur, it_tot, last, period, conf, comm_s, comp_s, dropped, calls, nbytes, dur, info, rings)

    def close(self) -> None:
        """Stop following every ring."""
        with self._lock:
            for tr in self.tracks.values():
                tr.close()
            self.tracks.clear()


def replay_ring(path: Path, *, chunk: int = 256, window: int = 20, buffer: int = 8192,
                node: str = "") -> RankTrack:
    """Feed a ring's records (e.g. kept after the job ended) through the exporter's per-rank logic.

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


def build(settings: Settings) -> RingCollector:
    """The ring collector for ``settings``."""
    return RingCollector(settings.ring_dir, node=settings.node, window=settings.window,
                         buffer=settings.buffer_calls)
