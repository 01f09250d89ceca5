"""The closed loop's reading of the trainer's progress lines: which iteration time it measures."""

from __future__ import annotations

import time

import pytest

from failslow_cli.stack.loop import LoopState


def test_the_pace_is_the_period_of_the_ranks_not_the_slowest_ranks_time() -> None:
    # two ranks of a synchronous job at 0.40 s per iteration whose iteration ends jitter by turns: each rank's
    # times average 0.40 s, but one of the two reads 0.45 s in every iteration, which the slowest would take
    s = LoopState(job="j", world=2)
    s.on_line("fault on: cpu:rank=1,quota=0.1 (until stopped)")
    for it in range(10):
        late, early = (0.45, 0.35) if it % 2 else (0.35, 0.45)
        s.on_line(f"rank  0 it {it:4d}   {late * 1000:.1f} ms loss 0.5")
        assert len(s.iterations) == it  # an iteration counts once every rank reported it
        s.on_line(f"rank  1 it {it:4d}   {early * 1000:.1f} ms")
    assert len(s.iterations) == 10 and s.fault_start is not None
    assert s.pace(s.t0 - 1.0, time.time() + 1.0) == pytest.approx(0.40)
    assert s.pace(time.time() + 1.0, time.time() + 2.0) is None  # fewer than three iterations
    s.on_line("not a progress line")
    assert len(s.iterations) == 10
