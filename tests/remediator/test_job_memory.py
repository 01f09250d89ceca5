"""What the remediator remembers of a job between events: where the healthy pace is measured, slow paths; and
which stretch of an event its ranks' compute is averaged over."""

from __future__ import annotations

import pytest

from remediator.observe import RankSample
from remediator.service import (
    HEALTHY_LEAST_S,
    HEALTHY_SETTLE_S,
    HEALTHY_WINDOW_S,
    compute_window,
    healthy_window,
    settled_ranks,
)


def test_a_first_event_takes_the_full_window_just_before_its_onset() -> None:
    assert healthy_window(1000.0, None) == (995.0, HEALTHY_WINDOW_S)


def test_an_event_closed_long_ago_does_not_shorten_the_window() -> None:
    assert healthy_window(1000.0, {"closed_at": 100.0}) == (995.0, HEALTHY_WINDOW_S)


def test_a_recent_close_starts_the_window_after_it_settled() -> None:
    end, window_s = healthy_window(1000.0, {"closed_at": 900.0}) or (0.0, 0.0)
    assert end == 995.0
    assert end - window_s == pytest.approx(900.0 + HEALTHY_SETTLE_S)
    assert window_s < HEALTHY_WINDOW_S  # a window length, not a timing


def test_too_little_clean_time_after_the_close_leaves_no_window() -> None:
    closed = 1000.0 - 5.0 - HEALTHY_SETTLE_S - HEALTHY_LEAST_S + 1.0
    assert healthy_window(1000.0, {"closed_at": closed}) is None
    assert healthy_window(1000.0, {"closed_at": closed - 2.0}) is not None


def test_the_compound_case_two_faults_back_to_back() -> None:
    """The link event closed 20 s before the CPU fault's onset: its slow iterations fill the two minutes."""
    assert healthy_window(5000.0, {"closed_at": 4980.0, "healthy_s": 0.37}) is None


def test_slow_paths_are_remembered_until_measured_healthy() -> None:
    from remediator.service import remember_paths

    known = remember_paths([], ["n0", "n1"], [["n0", "n1", 0.002]])
    assert known == [["n0", "n1", 0.002]]
    # a compute validation measures no link: nothing changes
    assert remember_paths(known, [], None) == known
    # another pair measured slow adds to it; the same pair measured again replaces its share
    more = remember_paths(known, ["n2", "n3"], [["n3", "n2", 0.1]])
    assert sorted(map(tuple, more)) == [("n0", "n1", 0.002), ("n3", "n2", 0.1)]
    assert remember_paths(more, ["n1", "n0"], [["n1", "n0", 0.5]]) == [["n3", "n2", 0.1], ["n1", "n0", 0.5]]
    # both ends measured and the path not found slow: it healed
    assert remember_paths(more, ["n0", "n1", "n2"], []) == [["n3", "n2", 0.1]]
    # one end measured only: not enough to say the path healed
    assert remember_paths(more, ["n0", "n2"], []) == more


def test_the_healthy_pace_is_the_lower_of_the_window_and_the_detectors_baseline() -> None:
    from remediator.service import healthy_estimate

    # a window that held slow iterations (or a healthy pace taken over from the last event) reads too high:
    # the detector's baseline is lower and wins
    assert healthy_estimate(0.479, 0.352) == 0.352
    # a clean window below the detector's baseline stands
    assert healthy_estimate(0.35, 0.36) == 0.35
    # either alone, or neither; nothing not a positive finite number counts
    assert healthy_estimate(None, 0.35) == 0.35 and healthy_estimate(0.35, None) == 0.35
    assert healthy_estimate(None, None) is None and healthy_estimate(None, 0.0) is None
    assert healthy_estimate(float("nan"), 0.35) == 0.35 and healthy_estimate(0.35, float("inf")) == 0.35


def test_compute_is_averaged_from_a_clean_reading_after_the_change_to_now() -> None:
    # onset at 1000 s, 1 s iterations, the exporter's window 20 iterations: clean from 1020 s
    assert compute_window(1000.0, 1.0, 1050.0, 20, 120.0) == pytest.approx(30.0)
    assert compute_window(1000.0, 2.0, 1050.0, 20, 120.0) == pytest.approx(10.0)  # slower job: later
    assert compute_window(1000.0, 1.0, 1500.0, 20, 120.0) == pytest.approx(120.0)  # at most the longest


def test_no_clean_stretch_yet_leaves_the_newest_reading() -> None:
    assert compute_window(1000.0, 1.0, 1015.0, 20, 120.0) is None  # the window still holds the change
    assert compute_window(1000.0, 1.0, 1020.5, 20, 120.0) is None  # under a second: one scrape at most
    assert compute_window(1000.0, 1.0, 1050.0, 20, 0.0) is None  # averaging switched off
    assert compute_window(1000.0, float("nan"), 1050.0, 20, 120.0) is None


def _samples(*compute: float) -> list[RankSample]:
    return [RankSample(r, r, 0, 0, str(r), c) for r, c in enumerate(compute)]


def test_a_rank_that_changed_inside_the_window_reads_its_newest_stretch() -> None:
    # rank 1 recovered 2x -> 1x after most of the window: its window mean still holds the fault
    window, earlier, recent = _samples(0.10, 0.24, 0.10), _samples(0.10, 0.29, 0.10), _samples(0.10, 0.15, 0.10)
    ranks, changed = settled_ranks(window, earlier, recent, 0.2)
    assert [r.compute_s for r in ranks] == [0.10, 0.15, 0.10] and changed == {1: (0.29, 0.15)}
    assert ranks[1].dp == 1 and ranks[1].node == "1"  # the rank keeps its coordinates
    # a rank slowing inside the window likewise
    ranks, changed = settled_ranks(_samples(0.12, 0.10), _samples(0.10, 0.10), _samples(0.16, 0.10), 0.2)
    assert [r.compute_s for r in ranks] == [0.16, 0.10] and changed == {0: (0.10, 0.16)}


def test_a_swing_within_the_shift_or_a_rank_without_both_stretches_stays_averaged() -> None:
    window = _samples(0.20, 0.20, 0.10)
    ranks, changed = settled_ranks(window, _samples(0.20, 0.20, 0.10), _samples(0.185, 0.21, 0.10), 0.2)
    assert ranks == window and not changed
    # rank 0 has no newest stretch, rank 2 nothing before it (a reading that just came back): both averaged
    ranks, changed = settled_ranks(window, _samples(0.20, 0.20), _samples(0.05, 0.20, 0.05)[1:], 0.2)
    assert ranks == window and not changed
