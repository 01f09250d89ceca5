"""The detector engine: job events from the ranks' verdicts, and the snapshot a restarted detector resumes from."""

from __future__ import annotations

import numpy as np
import pytest

from detector.engine import SNAPSHOT_FORMAT, Engine


def _feed(eng: Engine, rows: np.ndarray, t0: int) -> list[tuple[str, bool, float]]:
    out = []
    for k, row in enumerate(rows):
        samples = {("train", str(r)): float(v) for r, v in enumerate(row)}
        out += [(ch.what, ch.event.open, round(ch.event.ratio, 9)) for ch in eng.step(float(t0 + k), samples)]
    return out


def test_restore_resumes_the_same_verdicts_and_refuses_another_format() -> None:
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(1.0, 0.005, (30, 4)), rng.normal(1.4, 0.005, (20, 4))]
    x[38:45, 2] = np.nan  # one rank missing for a while: its history must travel in the snapshot too
    rest = rng.normal(1.0, 0.005, (15, 4))
    whole = Engine()
    assert [k for k, _, _ in _feed(whole, x, 0)][:1] == ["opened"]
    before = Engine()
    _feed(before, x, 0)
    arrays, meta = before.snapshot()
    after = Engine()
    assert after.restore(arrays, meta)
    tail_whole, tail_after = _feed(whole, rest, 50), _feed(after, rest, 50)
    assert tail_after == tail_whole and ("closed", False, 1.0) in tail_after
    assert after.jobs["train"].to_json() == whole.jobs["train"].to_json()

    # A snapshot laid out by another version (or taken with other settings) is not resumed from, and the
    # engine is left as it was.
    fresh = Engine()
    assert not fresh.restore(arrays, {**meta, "format": SNAPSHOT_FORMAT - 1})
    assert not fresh.restore(arrays, {**meta, "threshold": 0.2})
    assert fresh.n_series == 0 and fresh.jobs == {} and fresh.t == -1


@pytest.mark.parametrize(("after", "closes"), [(1.0, True), (1.3, True), (1.8, False)])
def test_job_event_closes_when_most_of_the_rise_is_taken_back(after: float, closes: bool) -> None:
    """A 2.7x fault that ends with the job at 1.3x its old level (the host got busier meanwhile) closes the
    event, as each rank's detector takes the residue as the new normal; a partial recovery to 1.8x does not.
    (CI's alert-path test once kept FailSlowDetected firing for minutes after its fault ended so.)"""
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(1.0, 0.005, (30, 4)), rng.normal(2.7, 0.01, (20, 4)), rng.normal(after, 0.005, (25, 4))]
    eng = Engine()
    seen = _feed(eng, x, 0)
    assert seen[0][:2] == ("opened", True)
    ev = eng.jobs["train"]
    assert ev.events == 1
    assert (not ev.open) is closes
    assert (("closed", False, 1.0) in seen) is closes
    if not closes:
        assert ev.ratio == pytest.approx(after, rel=0.02) and ev.peak == pytest.approx(2.7, rel=0.02)
