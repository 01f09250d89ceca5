"""Fault schedules by iteration, run by the launcher's polls (no training processes: progress is set by hand)."""

from __future__ import annotations

import time
from pathlib import Path

from testbed.config import ModelConfig
from testbed.launcher import JobConfig, Testbed


def _progress(tb: Testbed, done: int) -> None:
    tb.records = {r: [{"it": i} for i in range(done)] for r in range(4)}


def _job(tmp_path: Path) -> Testbed:
    """A DP2xPP2 job with a stage fault over iterations [1, 5), its training started (no processes)."""
    cfg = JobConfig(dp=2, pp=2, tp=1, iterations=100, micro_batches=2, namespaces=False,
                    model=ModelConfig(d_model=64, layers=2))
    tb = Testbed(cfg, ["stage:pp=1,layers=+2,start_iter=1,stop_iter=5"], run_dir=tmp_path)
    tb.training_start, tb._first_start = time.time(), time.monotonic()
    return tb


def test_a_window_that_passed_between_two_polls_runs_late_not_never(tmp_path: Path) -> None:
    tb = _job(tmp_path)
    f = tb.faults[0]
    _progress(tb, 8)  # the first poll comes after iteration 5: the window [1, 5) is gone
    tb._run_schedules()
    assert f.active and (f.schedule.start_iter, f.schedule.stop_iter) == (8, 12)
    _progress(tb, 10)
    tb._run_schedules()
    assert f.active
    _progress(tb, 12)  # as many iterations as asked for, then off; one episode
    tb._run_schedules()
    assert not f.active and len(f.episodes) == 1 and f.episodes[0]["end_unix_s"] is not None
    _progress(tb, 20)
    tb._run_schedules()
    assert not f.active and len(f.episodes) == 1  # not run again


def test_a_window_seen_in_time_runs_as_asked(tmp_path: Path) -> None:
    tb = _job(tmp_path)
    f = tb.faults[0]
    _progress(tb, 2)
    tb._run_schedules()
    assert f.active and (f.schedule.start_iter, f.schedule.stop_iter) == (1, 5)
    _progress(tb, 5)
    tb._run_schedules()
    assert not f.active and len(f.episodes) == 1
