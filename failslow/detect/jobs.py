"""The job-level fail-slow event rule: the per-series verdicts of a job's ranks become one event per job.

What it is for: :class:`~failslow.detect.events.EventTracker` keeps the fail-slow state of each series; a
training job runs many series (one per rank), and what is reported, stored and acted on is one event per
job. :func:`job_events_step` is that rule, one poll at a time, on the verdict arrays of a batch detector
(:class:`~failslow.detect.base.BatchVerdict`). It is pure: no I/O, no clock; the caller owns the events.

A job's event opens when at least ``quorum`` of its ranks (among those with a value) have an open slowdown
(in synchronous training every rank slows down with the straggler, so a majority is both natural and
robust to one noisy series); its onset is the earliest first-slow-sample among them, its baseline the
healthy level their detectors measure the slowdown against. It closes when fewer than ``quorum`` ranks are
slow *and* the job's level is back: under ``(1 + threshold)`` times the baseline, or having taken back
``RECOVER_SHARE`` of its rise to the event's peak (the same share as for each series, from
:mod:`failslow.detect.events`). The level matters, not just the ranks' verdicts, so an event restored after
the detectors' state was lost is not closed just because nobody remembers it.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from failslow.detect.base import BoolArray, FloatArray, IntArray
from failslow.detect.events import RECOVER_SHARE

OPENED = "opened"
CLOSED = "closed"
UPDATED = "updated"


@dataclass
class JobEvent:
    """The fail-slow state of one job (what the detector stores and exports).

    Attributes:
        job: Job name.
        open: Whether an event is open.
        onset_ts: Time of the earliest first-slow-sample of the open (or last) event.
        opened_ts: Time of the poll that opened it.
        closed_ts: Time of the poll that closed it (0.0 while open or never closed).
        baseline: The job's healthy level before the event (median of the slow ranks' baselines).
        ratio: The job's level over ``baseline`` (1.0 when closed).
        peak: Highest ``ratio`` of the open event (1.0 when closed).
        suspects: Culprit suspects, filled in by the caller (emptied when the event opens or closes).
        named: Every suspect named in the open event so far, as ``[kind, rank, node]`` (filled in and
            emptied as ``suspects``): what the exported suspects keep at 0 once no longer named.
        events: Events opened so far.
    """

    job: str
    open: bool = False
    onset_ts: float = 0.0
    opened_ts: float = 0.0
    closed_ts: float = 0.0
    baseline: float = 0.0
    ratio: float = 1.0
    peak: float = 1.0
    suspects: list[dict[str, Any]] = field(default_factory=list)
    named: list[list[str]] = field(default_factory=list)
    events: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobEvent:
        """Inverse of :meth:`to_json` (unknown keys ignored)."""
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)


@dataclass(frozen=True)
class JobChange:
    """What happened to a job at a poll: ``opened``, ``closed`` or ``updated`` (ratio moved)."""

    what: str
    event: JobEvent


def job_events_step(events: MutableMapping[str, JobEvent], jobs: Sequence[str], job_ids: IntArray,
                    last: FloatArray, failslow: BoolArray, onset: IntArray, slowdown: FloatArray,
                    baseline: FloatArray | None, *, ts: float, quorum: float, threshold: float,
                    onset_time: Callable[[int], float]) -> list[JobChange]:
    """Apply one poll's per-series verdicts to the jobs' events; returns what opened, closed or changed.

    Args:
        events: The jobs' events by name, updated in place (a job of ``jobs`` that has none gets a closed
            one); the :class:`JobChange` returned refer to these objects.
        jobs: Job names; ``job_ids`` indexes them.
        job_ids: Per series, the index in ``jobs`` of the job it belongs to.
        last: Per series, its latest value (NaN: none yet; such a series counts for nothing).
        failslow: Per series, whether it has an open slowdown (``BatchVerdict.failslow``).
        onset: Per series, the sample index of its open slowdown's first slow sample (``BatchVerdict.onset``).
        slowdown: Per series, its level over its baseline (``BatchVerdict.slowdown``).
        baseline: Per series, the healthy level of its open slowdown (``BatchVerdict.baseline``; NaN or
            None: unknown, the job's baseline is then its level over its ratio).
        ts: Time of this poll (``opened_ts``/``closed_ts``, and the onset when ``onset_time`` has none).
        quorum: Fraction of a job's ranks that must be slow to open its event (and to keep it open while
            its level is not back).
        threshold: Relative rise over the baseline under which the job's level is back.
        onset_time: The time of sample index ``i`` (NaN when unknown).

    Only jobs that may open and jobs already open are looked at series by series, so a poll over many
    healthy series costs a few vectorised counts.
    """
    n = len(jobs)
    seen = ~np.isnan(last)
    n_seen = np.bincount(job_ids[seen], minlength=n)
    n_slow = np.bincount(job_ids[seen & failslow], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(n_seen > 0, n_slow / np.maximum(n_seen, 1), 0.0)
    is_open = np.array([events[j].open if j in events else False for j in jobs], dtype=bool)
    # Only jobs that may open and jobs already open need per-job work: usually none or a few.
    todo = np.flatnonzero(((frac >= quorum) & ~is_open | is_open) & (n_seen > 0))
    changes: list[JobChange] = []
    for j in jobs:
        if j not in events:
            events[j] = JobEvent(job=j)
    for jid in todo.tolist():
        job = jobs[jid]
        ev = events[job]
        sl = np.flatnonzero((job_ids == jid) & seen)
        slow = failslow[sl]
        level = float(np.median(last[sl]))
        if not ev.open:
            ratio = float(np.median(slowdown[sl][slow]))
            first = int(onset[sl][slow].min())
            t_on = onset_time(first)
            ev.open = True
            ev.onset_ts = t_on if t_on == t_on else ts
            ev.opened_ts = ts
            ev.closed_ts = 0.0
            ev.ratio = ev.peak = ratio
            # The healthy level the ranks' detectors measure the slowdown against. Not the level of this
            # poll over the ratio: the poll that confirms a short slowdown can be its first healthy
            # sample (or the quorum is reached a poll after it ended), and a baseline read off it sits
            # a whole slowdown below the healthy level, so the level was never "back" and the event
            # never closed.
            base = baseline[sl][slow] if baseline is not None else np.zeros(0)
            base = base[np.isfinite(base) & (base > 0)]
            ev.baseline = float(np.median(base)) if base.size else (level / ratio if ratio > 0 else level)
            ev.suspects, ev.named = [], []
            ev.events += 1
            changes.append(JobChange(OPENED, ev))
            continue
        ratio = level / ev.baseline if ev.baseline > 0 else 1.0
        ev.peak = max(ev.peak, ratio)
        # Closed when fewer than a quorum of ranks are still slow and the job's level is back: under
        # the threshold, or most of the rise taken back (RECOVER_SHARE, as for each series: after a
        # 2.7x fault a host that got busier meanwhile may leave the job 1.3x its old level, which the
        # ranks' detectors take as the new normal; the event must not stay open for it forever).
        back = ratio < 1.0 + threshold or (
            ratio - 1.0 <= (1.0 - RECOVER_SHARE) * (ev.peak - 1.0))
        if frac[jid] < quorum and back:
            ev.open = False
            ev.closed_ts = ts
            ev.ratio = ev.peak = 1.0
            ev.suspects, ev.named = [], []
            changes.append(JobChange(CLOSED, ev))
        elif abs(ratio - ev.ratio) > 1e-9:
            ev.ratio = ratio
            changes.append(JobChange(UPDATED, ev))
    return changes
