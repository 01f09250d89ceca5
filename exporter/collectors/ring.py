"""Ring collector: per-rank iteration times and per-communicator call statistics from the call rings.

Every process tracked by the NCCL shim or the torch hook owns one ring file in the ring directory.
On each poll this collector opens rings of new processes, reads the records committed since the last
poll, and hands them to the core's `failslow.period.RankTrack`, which turns each rank's call stream
into iterations without knowing the framework; this module only maps what it says to metrics. Rings
of processes that have exited are read one last time and their series dropped.

Exposed per rank (labels job, rank, dp_rank, pp_rank, tp_rank, node): mean iteration time over the
last window, iterations completed, the wall time of the last iteration end (hang detection), calls
per iteration, and the split of an iteration into time inside and outside communication calls (a
straggler computes longer and waits less; a slow link makes everyone wait), with the part of the time
outside calls that lies outside the pipeline (work once per iteration). Per rank and
communicator: calls, bytes and time inside calls as counters and a summary, and one info series
naming the parallel group the communicator was matched to, so the detector can compare the ranks
of one group.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from prometheus_client.core import Metric

from exporter.collector import family
from exporter.settings import Settings
from failslow.errors import InputError
from failslow.period import CONFIDENCE_MIN, RankTrack
from failslow.record import OP_NAMES, RingReader, find_rings, process_alive
from failslow.topology import Coords

log = logging.getLogger("failslow.exporter.ring")

def rank_labels(tr: RankTrack) -> list[str]:
    """Values of ``job, rank, dp_rank, pp_rank, tp_rank, node``."""
    h = tr.header
    c: Coords | None = None
    if tr.layout is not None and 0 <= h.rank < tr.layout.world_size:
        c = tr.layout.coords(h.rank)
    coord = [str(c.dp), str(c.pp), str(c.tp)] if c is not None else ["", "", ""]
    # An unknown rank is named after the process so that two such processes never share a series.
    rank = str(h.rank) if h.rank >= 0 else f"pid-{h.pid}"
    return [h.job or "unknown", rank, *coord, tr.node]


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
        outside = family("failslow_iteration_outside_pipeline_compute_seconds")
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
            lab = rank_labels(tr)
            by_rank.setdefault((lab[0], lab[1]), []).append(tr)
            producers[tr.header.producer_name] = producers.get(tr.header.producer_name, 0) + 1
        comm_rows: dict[tuple[str, ...], list[float]] = {}
        info_rows: dict[tuple[str, ...], float] = {}
        for (job, rank), trs in sorted(by_rank.items()):
            main = max(trs, key=lambda t: (t.header.producer_name == "shim", t.iterations_total, -t.header.pid))
            lab = rank_labels(main)
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
                if (w := main.outside_pipeline_s) is not None:
                    outside.add_metric(lab, w)
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
        yield from (it_dur, it_tot, last, period, conf, comm_s, comp_s, outside, dropped, calls, nbytes, dur, info, rings)

    def close(self) -> None:
        """Stop following every ring."""
        with self._lock:
            for tr in self.tracks.values():
                tr.close()
            self.tracks.clear()


def build(settings: Settings) -> RingCollector:
    """The ring collector for ``settings``."""
    return RingCollector(settings.ring_dir, node=settings.node, window=settings.window,
                         buffer=settings.buffer_calls)
