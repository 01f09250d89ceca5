"""The fail-slow event rule: confirmed change points become open and closed slowdown events, per series.

What it is for: every method reports change points; :class:`EventTracker` keeps the fail-slow state of each
series on top of them. A confirmed change that lifts the level at least ``threshold`` above the healthy
baseline opens an event (the first slow sample is its onset); one that brings the level back closes it (a
recovery). Speed-ups while healthy (warm-up ending) move the baseline, but a rise back to the level the
series ran at before a speed-up is no slowdown until the faster level has lasted ``SETTLE`` samples.
The per-job rule on top of a job's series (:mod:`failslow.detect.jobs`) ends an event with the same
``RECOVER_SHARE``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detect.base import BoolArray, FloatArray, IntArray
from failslow.errors import InputError

RECOVER_SHARE = 0.8
"""Share of an open event's rise (from its healthy baseline to its peak) that the level must have taken back
to end the event (besides falling under the threshold), in one change or several."""

SETTLE = 32
"""Samples (time steps) a speed-up must last before its faster level is the series' new normal. Until then
a rise is judged against the level from before the speed-up as well, so the end of a short speed-up (a
return to a level the job already ran at) is no slowdown. 32 is the verification's window for a regime's
level (``VerifyConfig.before``): once the faster level fills it, it is what BOCD+V itself measures any
later change from, and the job has run faster for longer than the verification ever waits on a candidate
(``n_max`` = 16). In the service a sample is a poll (32 x 15 s = 8 min). The price: a slowdown that starts
within 32 samples of a speed-up and stays at or under the level before it cannot be told from the
speed-up's end and is not reported."""


class EventTracker:
    """Fail-slow event state per series, driven by confirmed change points.

    Args:
        n_series: Number of series.
        threshold: Relative rise over the healthy baseline that opens an event (0.10 = 10 %); the event
            closes when a later change brings the level back under it, or leaves it having taken back at
            least ``RECOVER_SHARE`` of the rise to the event's peak.
        settle: Samples a speed-up must last to become the reference a rise is judged against (``SETTLE``;
            0 = at once, plain BOCD's "any rise").
    """

    def __init__(self, n_series: int, threshold: float, settle: int = SETTLE) -> None:
        if threshold < 0:
            raise InputError(f"threshold must be non-negative, got {threshold}")
        if settle < 0:
            raise InputError(f"settle must be non-negative, got {settle}")
        self.threshold = threshold
        self.settle = settle
        self.baseline = np.full(n_series, np.nan)
        self.level = np.full(n_series, np.nan)
        self.open = np.zeros(n_series, dtype=bool)
        self.onset = np.full(n_series, -1, dtype=np.int64)
        self.peak = np.full(n_series, np.nan)  # highest level of each open event
        # The level a healthy series ran at before its latest speed-up (NaN: none), and the first sample of
        # that speed-up: a rise back to that level within `settle` samples is the speed-up's end.
        self.high = np.full(n_series, np.nan)
        self.since = np.full(n_series, -1, dtype=np.int64)

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.baseline.shape[0]
        if extra > 0:
            self.baseline = np.concatenate([self.baseline, np.full(extra, np.nan)])
            self.level = np.concatenate([self.level, np.full(extra, np.nan)])
            self.open = np.concatenate([self.open, np.zeros(extra, dtype=bool)])
            self.onset = np.concatenate([self.onset, np.full(extra, -1, dtype=np.int64)])
            self.peak = np.concatenate([self.peak, np.full(extra, np.nan)])
            self.high = np.concatenate([self.high, np.full(extra, np.nan)])
            self.since = np.concatenate([self.since, np.full(extra, -1, dtype=np.int64)])

    def state_dict(self) -> dict[str, Any]:
        """The tracker's arrays."""
        return {"baseline": self.baseline, "level": self.level, "open": self.open, "onset": self.onset,
                "peak": self.peak, "high": self.high, "since": self.since}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.baseline = np.array(state["baseline"], dtype=np.float64)
        self.level = np.array(state["level"], dtype=np.float64)
        self.open = np.array(state["open"], dtype=bool)
        self.onset = np.array(state["onset"], dtype=np.int64)
        # a state from before peaks were kept: the level an open event stands at is the best known peak
        self.peak = np.array(state["peak"] if "peak" in state else np.where(self.open, self.level, np.nan),
                             dtype=np.float64)
        # a state from before speed-ups were remembered: none is pending
        n = self.open.shape[0]
        self.high = np.array(state["high"] if "high" in state else np.full(n, np.nan), dtype=np.float64)
        self.since = np.array(state["since"] if "since" in state else np.full(n, -1), dtype=np.int64)

    def observe(self, changed: BoolArray, index: IntArray, before: FloatArray,
                after: FloatArray) -> tuple[BoolArray, BoolArray]:
        """Apply this step's confirmed changes; returns (opened, recovered) masks."""
        n = changed.shape[0]
        opened = np.zeros(n, dtype=bool)
        recovered = np.zeros(n, dtype=bool)
        if not changed.any():
            return opened, recovered
        idx = np.flatnonzero(changed)
        was_open = self.open[idx]
        c = index[idx]
        # While healthy the reference is the level just before the change (it follows warm-up and drift),
        # or the level from before a speed-up that began fewer than `settle` samples before this change,
        # whichever is higher: a return to a level the job ran at before a short speed-up is the speed-up's
        # end, not a slowdown (judged against the faster level alone it opened an event that never closed).
        # A speed-up that lasted `settle` samples is the new normal, and a rise from it is a slowdown.
        # During an event the reference stays the healthy level from before the event.
        high = self.high[idx]
        recent = ~was_open & ~np.isnan(high) & (c - self.since[idx] < self.settle)
        ref = np.where(recent & (np.abs(high) > np.abs(before[idx])), high, before[idx])
        base = np.where(was_open & ~np.isnan(self.baseline[idx]), self.baseline[idx], ref)
        lvl = after[idx]
        prev = np.abs(self.level[idx])
        peak = np.where(was_open, np.fmax(np.abs(self.peak[idx]), prev), prev)
        up, back = self._judge(base, peak, lvl)
        newly = ~was_open & up
        ended = was_open & back
        opened[idx[newly]] = True
        recovered[idx[ended]] = True
        self.open[idx[newly]] = True
        self.onset[idx[newly]] = index[idx[newly]]
        self.open[idx[ended]] = False
        self.onset[idx[ended]] = -1
        self.baseline[idx] = np.where(self.open[idx], base, lvl)
        self.level[idx] = lvl
        self.peak[idx] = np.where(self.open[idx], np.fmax(peak, np.abs(lvl)), np.nan)
        # A series left healthy below its reference by the threshold (a speed-up, or an event that ended
        # below its pre-event level) remembers the reference, and when the faster running began: a speed-up
        # in several steps counts from its first. Back at the reference, or in an event, nothing is pending.
        faster = ~self.open[idx] & (np.abs(lvl) * (1.0 + self.threshold) < np.abs(base))
        self.high[idx] = np.where(faster, base, np.nan)
        self.since[idx] = np.where(faster, np.where(recent, self.since[idx], c), -1)
        return opened, recovered

    def _judge(self, base: FloatArray, peak: FloatArray, lvl: FloatArray) -> tuple[BoolArray, BoolArray]:
        """Whether level `lvl` is a rise over `base` (opens an event), and whether it is back (ends one).

        Levels are compared as magnitudes so negative-valued generic series behave symmetrically. An open
        event ends under the threshold, or when the level has taken back most of its rise (RECOVER_SHARE):
        after a 2.8x fault the level can settle a little above the healthy level of minutes before (a noisy
        host drifts by 10-20 %), and that residue is not the fault. The level it settles at becomes the new
        healthy baseline (a residue that lasts is taken as the job's new normal, not a fail-slow). The rise
        is measured to the event's `peak`, not to the level just before this change: a recovery in steps (a
        mitigation that halves the slowdown, then the fault's end) must end the event too.
        """
        up = np.abs(lvl) > np.abs(base) * (1.0 + self.threshold)
        with np.errstate(invalid="ignore"):
            back = ~up | (np.abs(lvl) <= self._bound(np.abs(base), peak - np.abs(base)))
        return up, back

    def _bound(self, base: FloatArray, rise: FloatArray) -> FloatArray:
        """The recovery rule of :meth:`_judge` as the highest level that is back, for healthy levels `base`
        (magnitudes) and rises `rise` to the peak."""
        with np.errstate(invalid="ignore"):
            out: FloatArray = np.where(rise > 0, np.fmax(base * (1.0 + self.threshold),
                                                         base + (1.0 - RECOVER_SHARE) * rise),
                                       base * (1.0 + self.threshold))
        return out

    def would_end(self, idx: IntArray, after: FloatArray) -> BoolArray:
        """Whether a confirmed change of series `idx` to the levels `after` would end their open events
        (False where none is open): what :meth:`observe` would decide, without changing anything."""
        out: BoolArray = np.abs(np.asarray(after, dtype=np.float64)) <= self.back_bound(idx)
        return out

    def back(self, idx: IntArray, levels: FloatArray) -> BoolArray:
        """Per series `idx[i]` and level `levels[i, j]`: whether the level would end the series' open event
        (False where none is open, and for NaN)."""
        out: BoolArray = np.abs(levels) <= self.back_bound(idx)[:, None]
        return out

    def back_bound(self, idx: IntArray) -> FloatArray:
        """The highest level (magnitude) that ends the open event of each series `idx` (:meth:`_judge`: under
        the threshold over the baseline, or with ``RECOVER_SHARE`` of the rise to the peak taken back); NaN
        where none is open, so that no level ends it."""
        base = np.abs(self.baseline[idx])
        bound = self._bound(base, np.fmax(np.abs(self.peak[idx]), np.abs(self.level[idx])) - base)
        out: FloatArray = np.where(self.open[idx] & ~np.isnan(base), bound, np.nan)
        return out

    def open_baseline(self) -> FloatArray:
        """The healthy baseline of open events, NaN elsewhere."""
        out: FloatArray = np.where(self.open, self.baseline, np.nan)
        return out

    def slowdown(self) -> FloatArray:
        """Level over baseline for open events, 1.0 elsewhere."""
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.abs(self.level) / np.abs(self.baseline)
        return np.where(self.open & np.isfinite(r), r, 1.0)
