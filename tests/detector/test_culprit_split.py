"""The culprit window is cut down to the newest micro-batch split when the split changed inside it, and to
the newest incarnation when a rank restarted or moved (detector/culprit.py `settled_window`); the pipeline
sends per iteration are whole counts over a window (`_sends`)."""

from __future__ import annotations

import math
import re

import pytest

from detector.culprit import MIN_SETTLED_STEPS, _sends, settled_window
from detector.prom import Sample

STEP = 1.0


def _window(expr: str) -> float:
    return int(re.findall(r"\[(\d+)ms\]", expr)[-1]) / 1000


class SplitProm:
    """A DP2xPP2 job whose split went from [8, 8] to [13, 3] `ago` seconds ago: the exporter's calls per
    iteration (a send and a receive per micro-batch and the all-reduce) of its first stages changed then.
    Answers as Prometheus would: the ranks with a change (the join with their pipeline sends is left to the
    test on real Prometheus)."""

    def __init__(self, ago: float | None) -> None:
        self.ago = ago
        self.windows: list[float] = []

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        if expr.startswith(("sum by (rank) (resets(", "count by (rank) (last_over_time(")):
            return []  # no rank restarted or moved
        assert expr.startswith("(changes(failslow_iteration_period_calls{"), expr
        window = _window(expr)
        self.windows.append(window)
        changed = self.ago is not None and window > self.ago
        return [Sample({"rank": str(r)}, 1.0) for r in (0, 1)] if changed else []


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


def test_a_job_without_a_period_keeps_the_window() -> None:
    class Nothing:
        def query(self, expr: str, at: float | None = None) -> list[Sample]:
            return []

    assert settled_window(Nothing(), 'job="j"', 60.0, STEP) == 60.0  # type: ignore[arg-type]


class Ratios:
    """Answers the sends-per-iteration query with fixed ratios, keeping the expression asked."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values
        self.asked: list[str] = []

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        self.asked.append(expr)
        return [Sample({"rank": r}, v) for r, v in self.values.items()]


def test_sends_are_whole_counts_over_the_window() -> None:
    # 46.67 sends over 12 iterations (a rank of 4 micro-batches whose count and iterations were read at
    # slightly different moments), 13 a busy one, a rank whose iteration counter stopped (inf), a hung one
    prom = Ratios({"0": 3.889, "1": 12.6, "2": 0.4, "3": math.inf, "4": math.nan, "x": 2.0})
    assert _sends(prom, 'job="j"', "30000ms") == {0: 4.0, 1: 13.0, 2: 1.0}  # type: ignore[arg-type]
    expr = prom.asked[0]
    assert expr.count("increase(") == 2 and expr.count("[30000ms]") == 2, expr
    assert 'op="Send"' in expr and "failslow_iterations_total" in expr, expr


@pytest.mark.parametrize("ago", [0.5, 3.0])
def test_a_change_on_the_last_stage_alone_counts_too(ago: float) -> None:
    class LastStage(SplitProm):
        def query(self, expr: str, at: float | None = None) -> list[Sample]:
            out = super().query(expr, at)
            return [Sample(s.labels, s.value) for s in out if s.labels["rank"] not in ("0", "1")] + (
                [Sample({"rank": "3"}, 2.0)] if expr.startswith("(changes(") and _window(expr) > self.ago else [])

    assert settled_window(LastStage(ago), 'job="j"', 60.0, STEP) is None


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
        return []  # no period change


def test_a_window_holding_a_restart_or_a_move_is_cut_to_the_newest_incarnation() -> None:
    assert settled_window(MoveProm(20.0), 'job="j"', 60.0, STEP) == 7.5
    assert settled_window(MoveProm(3.0), 'job="j"', 60.0, STEP) is None
    assert settled_window(MoveProm(100.0), 'job="j"', 60.0, STEP) == 60.0
