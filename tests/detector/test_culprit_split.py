"""The culprit window is cut down to the newest micro-batch split when the split changed inside it, and to
the newest incarnation when a rank restarted or moved (detector/culprit.py `settled_window`)."""

from __future__ import annotations

import re

from detector.culprit import MIN_SETTLED_STEPS, settled_window
from detector.prom import Sample

STEP = 1.0


class SplitProm:
    """Answers the pipeline-sends queries of a DP2 job whose split went from [8, 8] to [13, 3] `ago` seconds
    ago: the newest rate, or its time average over a subquery window."""

    def __init__(self, ago: float | None) -> None:
        self.ago = ago
        self.windows: list[float] = []

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        if expr.startswith(("sum by (rank) (resets(", "count by (rank) (last_over_time(")):
            return []  # no rank restarted or moved
        assert 'op="Send"' in expr and "failslow_iterations_total" in expr, expr
        m = re.search(r"\)\[(\d+)ms:(\d+)ms\]\)$", expr)
        window = None if m is None else int(m.group(1)) / 1000
        if window is not None:
            self.windows.append(window)
        out = []
        for rank, (before, after) in {0: (8, 13), 1: (8, 3)}.items():
            if self.ago is None:
                v = float(before)
            elif window is None or window <= self.ago:
                v = float(after)
            else:
                v = (after * self.ago + before * (window - self.ago)) / window
            out.append(Sample({"rank": str(rank)}, v))
        return out


def test_an_unchanged_split_keeps_the_window() -> None:
    assert settled_window(SplitProm(None), 'job="j"', 60.0, STEP) == 60.0
    assert settled_window(SplitProm(100.0), 'job="j"', 60.0, STEP) == 60.0
    # a short window is checked like any other (the first analysis after an onset)
    assert settled_window(SplitProm(None), 'job="j"', 3.0, STEP) == 3.0


def test_a_window_holding_the_change_is_cut_to_the_newest_split_and_once_more() -> None:
    prom = SplitProm(20.0)
    w = settled_window(prom, 'job="j"', 60.0, STEP)
    assert prom.windows == [60.0, 30.0, 15.0]  # 15 s is the first to hold [13, 3] alone
    assert w == 7.5


def test_a_change_too_recent_waits_and_the_cut_never_goes_below_the_minimum() -> None:
    assert settled_window(SplitProm(4.0), 'job="j"', 60.0, STEP) is None
    assert settled_window(SplitProm(7.0), 'job="j"', 60.0, STEP) is None  # 7.5 s still holds [8, 8]
    assert settled_window(SplitProm(8.0), 'job="j"', 60.0, STEP) == MIN_SETTLED_STEPS * STEP


def test_a_job_without_pipeline_sends_keeps_the_window() -> None:
    class NoSends:
        def query(self, expr: str, at: float | None = None) -> list[Sample]:
            return []

    assert settled_window(NoSends(), 'job="j"', 60.0, STEP) == 60.0  # type: ignore[arg-type]


class MoveProm:
    """A pure-DP job whose rank 1 moved to another node (an S4 restart) `ago` seconds ago: its counter reset
    and its old series ended then."""

    def __init__(self, ago: float) -> None:
        self.ago = ago

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        window = int(re.findall(r"\[(\d+)ms\]", expr)[-1]) / 1000 if "[" in expr else 0.0
        holds = window > self.ago
        if expr.startswith("sum by (rank) (resets("):
            return [Sample({"rank": "0"}, 0.0), Sample({"rank": "1"}, 1.0 if holds else 0.0)]
        if expr.startswith("count by (rank) (last_over_time("):
            return [Sample({"rank": "0"}, 1.0), Sample({"rank": "1"}, 2.0 if holds else 1.0)]
        return []  # no pipeline sends


def test_a_window_holding_a_restart_or_a_move_is_cut_to_the_newest_incarnation() -> None:
    assert settled_window(MoveProm(20.0), 'job="j"', 60.0, STEP) == 7.5
    assert settled_window(MoveProm(3.0), 'job="j"', 60.0, STEP) is None
    assert settled_window(MoveProm(100.0), 'job="j"', 60.0, STEP) == 60.0
