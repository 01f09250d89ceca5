"""The job-level event rule (:func:`failslow.detect.job_events_step`): a quorum of slow ranks opens a job's
event, its onset is the earliest slow rank's, its baseline the slow ranks' baselines; it closes once fewer
than a quorum are slow and the job's level is back (under the threshold, or ``RECOVER_SHARE`` of the rise
taken back); in between the ratio follows the job's level."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from failslow.detect import RECOVER_SHARE, JobChange, JobEvent, job_events_step

THRESHOLD = 0.10
QUORUM = 0.5


def _time(i: int) -> float:
    """Sample index -> time: poll i at 1000 + 10 i."""
    return 1000.0 + 10.0 * i if i >= 0 else math.nan


class Job:
    """One job "a" of ``n`` series (plus a healthy job "b" of two), fed one poll at a time."""

    def __init__(self, n: int = 4, quorum: float = QUORUM) -> None:
        self.n = n
        self.quorum = quorum
        self.jobs = ["a", "b"]
        self.ids = np.array([0] * n + [1, 1], dtype=np.int64)
        self.events: dict[str, JobEvent] = {}

    def step(self, ts: float, last: list[float], slow: list[bool], onset: list[int] | None = None,
             slowdown: list[float] | None = None, baseline: list[float] | None = None,
             onset_time: Callable[[int], float] = _time) -> list[JobChange]:
        """Job "a" gets ``last``/``slow``/...; job "b" sits at 1.0, healthy."""
        n = self.n
        on = onset if onset is not None else [3 if s else -1 for s in slow]
        sd = slowdown if slowdown is not None else [2.0 if s else 1.0 for s in slow]
        base = None if baseline is None else np.array([*baseline, math.nan, math.nan])
        assert len(last) == len(slow) == len(on) == len(sd) == n
        return job_events_step(
            self.events, self.jobs, self.ids, np.array([*last, 1.0, 1.0]), np.array([*slow, False, False]),
            np.array([*on, -1, -1], dtype=np.int64), np.array([*sd, 1.0, 1.0]), base, ts=ts,
            quorum=self.quorum, threshold=THRESHOLD, onset_time=onset_time)


def _whats(changes: list[JobChange]) -> list[tuple[str, str]]:
    return [(c.what, c.event.job) for c in changes]


def test_every_job_gets_an_event_and_healthy_polls_change_nothing() -> None:
    job = Job()
    assert job.step(10.0, [1.0] * 4, [False] * 4) == []
    assert set(job.events) == {"a", "b"}
    assert not job.events["a"].open and job.events["a"].events == 0


def test_opens_on_quorum_only() -> None:
    job = Job()
    # one slow rank of four: under the quorum
    assert job.step(10.0, [2.0, 1.0, 1.0, 1.0], [True, False, False, False]) == []
    assert not job.events["a"].open
    # two of four: the quorum (0.5) is reached
    ch = job.step(20.0, [2.0, 2.0, 1.0, 1.0], [True, True, False, False])
    assert _whats(ch) == [("opened", "a")]
    ev = job.events["a"]
    assert ch[0].event is ev
    assert ev.open and ev.opened_ts == 20.0 and ev.closed_ts == 0.0 and ev.events == 1
    assert ev.ratio == ev.peak == 2.0
    assert ev.suspects == []
    assert not job.events["b"].open


def test_series_without_a_value_do_not_count() -> None:
    job = Job()
    # two slow of the two ranks with a value (the other two have never reported): quorum
    ch = job.step(10.0, [2.0, 2.0, math.nan, math.nan], [True, True, False, False])
    assert _whats(ch) == [("opened", "a")]


def test_onset_is_the_earliest_slow_series() -> None:
    job = Job()
    # the healthy rank's onset (0) is not looked at, the slow ones' earliest (4) is
    job.step(50.0, [2.0, 2.0, 2.0, 1.0], [True, True, True, False], onset=[7, 4, 9, 0])
    assert job.events["a"].onset_ts == _time(4)


def test_onset_time_unknown_falls_back_to_the_poll() -> None:
    job = Job()
    job.step(50.0, [2.0, 2.0, 1.0, 1.0], [True, True, False, False], onset_time=lambda i: math.nan)
    assert job.events["a"].onset_ts == 50.0


def test_ratio_is_the_median_slowdown_of_the_slow_series() -> None:
    job = Job()
    job.step(10.0, [3.0, 2.0, 4.0, 1.0], [True, True, True, False], slowdown=[3.0, 2.0, 4.0, 9.0])
    assert job.events["a"].ratio == job.events["a"].peak == 3.0


def test_baseline_from_the_slow_series_baselines() -> None:
    job = Job()
    # median over the slow ranks' finite, positive baselines: the healthy rank's (9.0), a NaN and a 0 are not
    job.step(10.0, [2.0, 2.2, 2.4, 1.0], [True, True, True, False], baseline=[1.0, 1.2, math.nan, 9.0])
    assert job.events["a"].baseline == pytest.approx(1.1)
    job = Job()
    job.step(10.0, [2.0, 2.2, 2.4, 1.0], [True, True, True, False], baseline=[0.0, 1.2, math.nan, 9.0])
    assert job.events["a"].baseline == pytest.approx(1.2)


def test_baseline_without_detector_baselines_is_level_over_ratio() -> None:
    job = Job()
    # level = median of the last values of the job's series = 2.0; ratio = median slowdown = 2.0
    job.step(10.0, [3.0, 2.0, 2.0, 1.0], [True, True, True, False])
    assert job.events["a"].baseline == pytest.approx(1.0)
    job = Job()
    job.step(10.0, [3.0, 2.0, 2.0, 1.0], [True, True, True, False],
             baseline=[math.nan, math.nan, math.nan, math.nan])
    assert job.events["a"].baseline == pytest.approx(1.0)


def _open(job: Job, level: float = 2.0) -> None:
    """Open job "a" at ``level`` over a baseline of 1.0."""
    ch = job.step(10.0, [level] * 4, [True] * 4, slowdown=[level] * 4, baseline=[1.0] * 4)
    assert _whats(ch) == [("opened", "a")]
    assert job.events["a"].baseline == 1.0


def test_updated_ratio_follows_the_level() -> None:
    job = Job()
    _open(job)
    ch = job.step(20.0, [2.5] * 4, [True] * 4)
    assert _whats(ch) == [("updated", "a")]
    ev = job.events["a"]
    assert ev.ratio == 2.5 and ev.peak == 2.5 and ev.open
    # the same level again: nothing to report
    assert job.step(30.0, [2.5] * 4, [True] * 4) == []
    # lower while still slow: ratio follows, the peak stays
    ch = job.step(40.0, [2.2] * 4, [True] * 4)
    assert _whats(ch) == [("updated", "a")]
    assert ev.ratio == pytest.approx(2.2) and ev.peak == 2.5


def test_close_when_below_quorum_and_level_back() -> None:
    job = Job()
    _open(job)
    ev = job.events["a"]
    # back under the threshold but still a quorum of slow ranks: stays open
    ch = job.step(20.0, [1.05] * 4, [True, True, False, False])
    assert ev.open and _whats(ch) == [("updated", "a")]
    # under the quorum and back: closes
    ev.suspects = [{"rank": "0"}]
    ch = job.step(30.0, [1.05] * 4, [True, False, False, False])
    assert _whats(ch) == [("closed", "a")]
    assert not ev.open and ev.closed_ts == 30.0 and ev.ratio == ev.peak == 1.0 and ev.suspects == []
    assert ev.opened_ts == 10.0 and ev.events == 1
    # a later quorum opens a second event
    ch = job.step(40.0, [2.0] * 4, [True] * 4, baseline=[1.0] * 4)
    assert _whats(ch) == [("opened", "a")] and ev.events == 2 and ev.closed_ts == 0.0


def test_no_slow_ranks_but_level_not_back_stays_open() -> None:
    # e.g. an event restored after the detectors' state was lost: nobody is slow, the job is not back
    job = Job()
    job.events["a"] = JobEvent(job="a", open=True, onset_ts=5.0, opened_ts=5.0, baseline=1.0, ratio=2.0,
                               peak=2.0, events=1)
    assert job.step(20.0, [2.0] * 4, [False] * 4) == []
    assert job.events["a"].open
    ch = job.step(30.0, [1.0] * 4, [False] * 4)
    assert _whats(ch) == [("closed", "a")]


def test_recover_share_closes_above_the_threshold() -> None:
    peak = 3.0
    rest = 1.0 + (1.0 - RECOVER_SHARE) * (peak - 1.0)  # the level at which the share is taken back
    job = Job()
    _open(job, peak)
    ev = job.events["a"]
    # not enough of the rise taken back: open, ratio updated
    ch = job.step(20.0, [rest + 0.1] * 4, [False] * 4)
    assert _whats(ch) == [("updated", "a")] and ev.open
    assert ev.ratio == pytest.approx(rest + 0.1) and ev.peak == peak
    # RECOVER_SHARE of the rise taken back, still above the threshold: closed
    assert rest > 1.0 + THRESHOLD
    ch = job.step(30.0, [rest - 0.01] * 4, [False] * 4)
    assert _whats(ch) == [("closed", "a")] and not ev.open


def test_peak_counts_rises_after_the_opening() -> None:
    job = Job()
    _open(job, 2.0)
    job.step(20.0, [4.0] * 4, [True] * 4)
    assert job.events["a"].peak == 4.0
    # 1.5 is not back against the opening ratio (2.0) but is against the peak (4.0)
    ch = job.step(30.0, [1.5] * 4, [False] * 4)
    assert _whats(ch) == [("closed", "a")]


def test_jobs_are_independent() -> None:
    events: dict[str, JobEvent] = {}
    ids = np.array([0, 0, 1, 1], dtype=np.int64)
    ch = job_events_step(events, ["a", "b"], ids, np.array([2.0, 2.0, 1.0, 1.0]),
                         np.array([True, True, False, False]), np.array([3, 3, -1, -1], dtype=np.int64),
                         np.array([2.0, 2.0, 1.0, 1.0]), None, ts=10.0, quorum=QUORUM, threshold=THRESHOLD,
                         onset_time=_time)
    assert _whats(ch) == [("opened", "a")]
    assert events["a"].open and not events["b"].open
