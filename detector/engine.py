"""The detector's pure core: per-rank series in one vectorised detector, per-job fail-slow events on top.

No I/O here: the service feeds :meth:`Engine.step` with one sample per (job, rank) per poll and gets back
the job events that opened, changed or closed; state round-trips through plain arrays and JSON.

The engine keeps the bookkeeping (which series is which (job, rank), poll times, last values, snapshots);
the rules are the core's: each series' events come from the detector
(:class:`failslow.detect.events.EventTracker`), a job's event from :func:`failslow.detect.jobs.job_events_step`
(opens on a quorum of slow ranks, closes when fewer are slow and the job's level is back).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from failslow.detect import (
    BatchDetector,
    BOCDConfig,
    JobChange,
    JobEvent,
    VerifyConfig,
    job_events_step,
    keep_series,
    make_detector,
)

Key = tuple[str, str]  # (job, rank)
TIME_RING = 1024  # poll times kept to turn sample indices into timestamps
SNAPSHOT_FORMAT = 2
"""Layout of the snapshot; 2: the verification history keeps observed samples only (with their times).
A snapshot of another format is not resumed from: the detectors start afresh (the events survive)."""




class Engine:
    """Vectorised detection over every (job, rank) plus per-job events.

    Args:
        method: Registered detection method.
        threshold: Relative rise that counts (verification threshold and event threshold).
        quorum: Fraction of a job's ranks that must be slow to open its event.
        dtype: Precision of the BOCD state.
    """

    def __init__(self, method: str = "bocd-v", threshold: float = 0.10, quorum: float = 0.5,
                 dtype: str = "float32") -> None:
        self.method = method
        self.threshold = threshold
        self.quorum = quorum
        self.dtype = dtype
        self.keys: list[Key] = []
        self.index: dict[Key, int] = {}
        self.labels: dict[Key, dict[str, str]] = {}
        self.jobs: dict[str, JobEvent] = {}
        self.times = np.full(TIME_RING, np.nan)
        self.t = -1  # index of the last poll fed to the detector
        self.last: np.ndarray = np.zeros(0)
        self._det: BatchDetector | None = None
        self._job_names: list[str] = []
        self._job_ids = np.zeros(0, dtype=np.int64)
        self._job_slots_n = -1

    def _options(self) -> dict[str, Any]:
        if self.method in ("bocd-v", "bocd"):
            return {"bocd": BOCDConfig(dtype=self.dtype), "verify": VerifyConfig(threshold=self.threshold)}
        return {"threshold": self.threshold}

    @property
    def n_series(self) -> int:
        """Series tracked."""
        return len(self.keys)

    def _ensure(self, keys: list[Key]) -> None:
        new = [k for k in keys if k not in self.index]
        for k in new:
            self.index[k] = len(self.keys)
            self.keys.append(k)
        if not self.keys:
            return
        if self._det is None:
            self._det = make_detector(self.method, len(self.keys), **self._options())
            # Nothing seen yet: align the detector's clock with ours.
            self._det.seek(self.t)
        elif new:
            self._det.grow(len(self.keys))
        if self.last.shape[0] < len(self.keys):
            self.last = np.concatenate([self.last, np.full(len(self.keys) - self.last.shape[0], np.nan)])

    def step(self, ts: float, samples: dict[Key, float], labels: dict[Key, dict[str, str]] | None = None,
             sample_ts: float | None = None) -> list[JobChange]:
        """Feed one poll: ``samples`` maps (job, rank) to the latest value (NaN or absent = missing).

        ``ts`` is the poll time; ``sample_ts``, when known, the time the samples were taken (what an
        onset is reported in).
        """
        self._ensure(list(samples))
        if labels:
            self.labels.update(labels)
        self.t += 1
        self.times[self.t % TIME_RING] = ts if sample_ts is None or sample_ts != sample_ts else sample_ts
        if self._det is None:
            return []
        x = np.full(len(self.keys), np.nan)
        for k, v in samples.items():
            x[self.index[k]] = v
        verdict = self._det.update(x)
        fresh = ~np.isnan(x)
        self.last[fresh] = x[fresh]
        names, ids = self._job_index()
        return job_events_step(self.jobs, names, ids, self.last, verdict.failslow, verdict.onset,
                               verdict.slowdown, verdict.baseline, ts=ts, quorum=self.quorum,
                               threshold=self.threshold, onset_time=self.onset_time)

    def onset_time(self, index: int) -> float:
        """Timestamp of the poll that produced sample ``index`` (NaN when it left the ring)."""
        if index < 0 or self.t - index >= TIME_RING:
            return math.nan
        return float(self.times[index % TIME_RING])

    def _job_index(self) -> tuple[list[str], np.ndarray]:
        # Rebuilt only when series were added: a poll at 16k ranks must not walk a dict per rank.
        if self._job_slots_n != len(self.keys):
            names = sorted({k[0] for k in self.keys})
            pos = {j: i for i, j in enumerate(names)}
            self._job_names = names
            self._job_ids = np.array([pos[k[0]] for k in self.keys], dtype=np.int64)
            self._job_slots_n = len(self.keys)
        return self._job_names, self._job_ids

    def drop(self, keys: list[Key]) -> list[str]:
        """Forget dead series (their detector state, labels, last values); returns the jobs left with none.

        The remaining series resume exactly where they were. A job whose every series is gone is removed
        from ``jobs`` too (its event, open or not, ends with the job).
        """
        gone = {k for k in keys if k in self.index}
        if not gone:
            return []
        keep = [i for i, k in enumerate(self.keys) if k not in gone]
        if self._det is not None:
            self._det = keep_series(self._det, self.method, keep, **self._options()) if keep else None
        self.keys = [self.keys[i] for i in keep]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.last = self.last[np.asarray(keep, dtype=np.int64)] if keep else np.zeros(0)
        for k in gone:
            self.labels.pop(k, None)
        self._job_slots_n = -1
        alive = {k[0] for k in self.keys}
        dead = sorted({k[0] for k in gone} - alive)
        for j in dead:
            self.jobs.pop(j, None)
        return dead

    def forget_job(self, job: str) -> None:
        """Forget a job that has no series (e.g. an event restored from Redis for a job that is gone)."""
        if not any(k[0] == job for k in self.keys):
            self.jobs.pop(job, None)

    # ------------------------------------------------------------------ persistence
    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays (detector state) and JSON metadata (index, times, jobs) to resume from."""
        arrays: dict[str, np.ndarray] = {}
        if self._det is not None:
            arrays = {k: np.asarray(v) for k, v in self._det.state_dict().items()}
        arrays["engine.times"] = self.times
        arrays["engine.last"] = self.last
        meta = {"format": SNAPSHOT_FORMAT, "method": self.method, "dtype": self.dtype,
                "threshold": self.threshold, "t": self.t,
                "keys": [list(k) for k in self.keys],
                "labels": [[k[0], k[1], v] for k, v in self.labels.items()],
                "jobs": {j: e.to_json() for j, e in self.jobs.items()}}
        return arrays, meta

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bool:
        """Resume from :meth:`snapshot`; False (and nothing changed) if it was taken with other settings
        or by a version that laid the detector state out differently."""
        if (meta.get("format"), meta.get("method"), meta.get("dtype"), meta.get("threshold")) != (
                SNAPSHOT_FORMAT, self.method, self.dtype, self.threshold):
            return False
        keys = [(str(a), str(b)) for a, b in meta["keys"]]
        self.keys, self.index = [], {}
        self._det = None
        self._job_slots_n = -1
        self.t = int(meta["t"])
        self._ensure(keys)
        if self._det is not None:
            self._det.load_state_dict({k: v for k, v in arrays.items() if not k.startswith("engine.")})
        self.times = np.array(arrays["engine.times"], dtype=np.float64)
        self.last = np.array(arrays["engine.last"], dtype=np.float64)
        self.labels = {(a, b): dict(v) for a, b, v in meta.get("labels", [])}
        for j, doc in meta.get("jobs", {}).items():
            self.jobs[j] = JobEvent.from_json(doc)
        return True
