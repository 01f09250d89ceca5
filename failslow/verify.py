"""BOCD with verification (BOCD+V, FALCON's detector) and plain BOCD, as batch detectors.

What it is for: turning BOCD's run-length posterior into change points a human should hear about.

* **Plain BOCD** (the baseline FALCON compares against) reports a change whenever the MAP run length
  restarts at a sample later than the last reported one. It is fast to react and fooled by every spike.
* **BOCD+V** treats a restart only as a *candidate* regime start ``c``. Once at least ``n_min`` samples
  of the new regime exist it compares robust levels: the median of up to ``before`` samples preceding
  ``c`` (never crossing the last confirmed change) against the median of the samples since ``c``.
  The change is confirmed when the levels differ by at least ``threshold`` of the level before (10 % by
  default, as in FALCON) *and* by ``z`` standard errors (the spread is the larger MAD of the two regimes), so
  a noisy series waits for a few more samples instead of paging on jitter. The level after must also stand
  off where the trend before would have taken the old regime (a robust line through the last ``before``
  samples, and through their logarithms: :func:`_beyond_trend`), and must not repeat what the series did one
  period earlier when it was already repeating itself (:func:`_seasonal`). A candidate is re-examined as
  samples arrive, up to ``n_max`` samples after it, then dropped.

Why this survives real jobs: a checkpoint or evaluation spike every N iterations makes BOCD restart, but
a median over at least ``n_min`` samples ignores a lone spike; missing samples take no room in the history
(the windows are the last observed samples, so a gap of any length leaves the regime before it to compare
with); warm-up shows up as a downward change (a speed-up), which never opens a fail-slow
event; slow drift never moves the median of the next few samples 10 % away from that of the previous
ones, and a faster trend (growth, a ramp in small stairs) is extrapolated rather than taken for a change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.bocd import BOCD, BOCDConfig
from failslow.detect import SETTLE, BatchVerdict, EventTracker
from failslow.errors import InputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class VerifyConfig:
    """Parameters of the verification step.

    Attributes:
        threshold: Minimum relative change of the level (0.10 = 10 %) to confirm a change point.
        z: Minimum change in standard errors of the difference of the two levels.
        n_min: Samples of the new regime needed before a candidate is examined (5: a median of five ignores two outliers).
        n_max: Samples after which an unconfirmed candidate is dropped.
        before: Samples before the candidate used for the level before.
        min_before: Fewer samples than this since the last confirmed change: not a candidate.
        consistency: Quantile of the new regime's samples that must already be half the threshold past
            the level before (see ``_consistent``): the whole regime moved, not just its median.
    """

    threshold: float = 0.10
    z: float = 5.0
    n_min: int = 5
    n_max: int = 16
    before: int = 32
    min_before: int = 5
    consistency: float = 0.25

    def __post_init__(self) -> None:
        if self.threshold < 0.0:
            raise InputError(f"threshold must be non-negative, got {self.threshold}")
        if self.z < 0:
            raise InputError("z must be non-negative")
        if not 1 <= self.n_min <= self.n_max:
            raise InputError("need 1 <= n_min <= n_max")
        if self.before < 2 or self.min_before < 1:
            raise InputError("before must be >= 2 and min_before >= 1")
        if not 0.0 <= self.consistency <= 0.5:
            raise InputError("consistency must be in [0, 0.5]")

    @property
    def history(self) -> int:
        """Samples of history each series keeps."""
        return self.before + self.n_max + 1


class History:
    """The last ``width`` *observed* samples of each series, each with the time index it was taken at.

    A missing sample (NaN) takes no room: a series whose exporter was away for a minute, or a poll that
    found Prometheus restarting, still has the samples of the regime before the gap to compare a change
    against (a ring of time steps lost them to NaN and left such a change unconfirmable). Laid out
    slot x series; ``n`` counts each series' observed samples, so its k-th last sample sits in slot
    ``(n - k) % width``.
    """

    def __init__(self, n_series: int, width: int) -> None:
        self.width = width
        self.val = np.full((width, n_series), np.nan)
        self.at = np.full((width, n_series), -1, dtype=np.int64)
        self.n = np.zeros(n_series, dtype=np.int64)

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.val.shape[1]
        if extra > 0:
            self.val = np.hstack([self.val, np.full((self.width, extra), np.nan)])
            self.at = np.hstack([self.at, np.full((self.width, extra), -1, dtype=np.int64)])
            self.n = np.concatenate([self.n, np.zeros(extra, dtype=np.int64)])

    def push(self, t: int, x: FloatArray) -> None:
        """Store the observed samples of time ``t``."""
        cols = np.flatnonzero(~np.isnan(x))
        if cols.size == self.n.shape[0] and cols.size and self.n.min() == self.n.max():
            # Lock step, every series observed (the usual case): one contiguous row.
            slot0 = int(self.n[0]) % self.width
            self.val[slot0] = x
            self.at[slot0] = t
            self.n += 1
            return
        slot = self.n[cols] % self.width
        self.val[slot, cols] = x[cols]
        self.at[slot, cols] = t
        self.n[cols] += 1

    def state(self) -> dict[str, np.ndarray]:
        """One row per series (the snapshot format)."""
        return {"hist": self.val.T.copy(), "hist_at": self.at.T.copy(), "hist_n": self.n.copy()}

    def load_state(self, state: dict[str, Any], n_series: int) -> None:
        """Inverse of :meth:`state`."""
        missing = [k for k in ("hist", "hist_at", "hist_n") if k not in state]
        if missing:
            raise InputError(f"history state lacks {missing} (a snapshot of an older format)")
        val = np.asarray(state["hist"], dtype=np.float64)
        at = np.asarray(state["hist_at"], dtype=np.int64)
        n = np.asarray(state["hist_n"], dtype=np.int64)
        want = (n_series, self.width)
        if val.shape != want or at.shape != want or n.shape != (n_series,):
            raise InputError(f"history has shape {val.shape}/{at.shape}/{n.shape}, expected {want}")
        self.val = np.ascontiguousarray(val.T)
        self.at = np.ascontiguousarray(at.T)
        self.n = n.copy()

    def _take(self, a: np.ndarray, rows: IntArray | None, k: int, pad: float | int) -> np.ndarray:
        """The last ``k`` (<= width) entries of ``a`` for each row (every series if None), oldest first."""
        if rows is not None and rows.size == self.n.shape[0]:
            rows = None  # rows come sorted and unique (flatnonzero): this is every series
        n = self.n if rows is None else self.n[rows]
        if n.size and n[0] >= k and n.min() == n.max():
            # Lock step (the usual case): one set of slots for every row, read as k contiguous rows.
            slot = (int(n[0]) - k + np.arange(k)) % self.width
            out = a[slot] if rows is None else a[np.ix_(slot, rows)]
            return out.T  # a view: reductions over a row run along contiguous memory
        cols = np.arange(self.n.shape[0]) if rows is None else rows
        j = n[:, None] - k + np.arange(k)[None, :]
        return np.where(j >= 0, a[j % self.width, cols[:, None]], pad)

    def recent(self, rows: IntArray | None, k: int) -> FloatArray:
        """The last ``k`` (<= width) observed samples of each row (every series if None), oldest first;
        rows with fewer samples are padded on the left with NaN."""
        return self._take(self.val, rows, k, np.nan)

    def recent_times(self, rows: IntArray | None, k: int) -> IntArray:
        """The time indices of :meth:`recent`'s samples (-1 for padding)."""
        return self._take(self.at, rows, k, -1)

    def window(self, rows: IntArray, lo: IntArray, hi: IntArray, width: int) -> FloatArray:
        """The last ``width`` observed samples of each row taken at times ``[lo, hi)``; NaN elsewhere.

        The result has ``self.width`` columns, in time order; which columns hold the samples does not
        matter to the medians and quantiles read from it.
        """
        return self.window_at(rows, lo, hi, width)[0]

    def window_at(self, rows: IntArray, lo: IntArray, hi: IntArray,
                  width: int) -> tuple[FloatArray, FloatArray]:
        """:meth:`window` and the time index of each of its samples (NaN where the value is NaN)."""
        vals, times = self.recent(rows, self.width), self.recent_times(rows, self.width)
        sel = (times >= 0) & (times >= lo[:, None]) & (times < hi[:, None])
        # Selected samples at or after each column: keep the last `width` of them.
        later = np.cumsum(sel[:, ::-1], axis=1)[:, ::-1]
        keep = sel & (later <= width)
        return np.where(keep, vals, np.nan), np.where(keep, times.astype(np.float64), np.nan)


def _nanmedian_rows(a: FloatArray) -> FloatArray:
    """Row medians ignoring NaN (NaN for an all-NaN row) without nanmedian's warnings."""
    out = np.full(a.shape[0], np.nan)
    if a.shape[0] == 0:
        return out
    n = np.sum(~np.isnan(a), axis=1)
    s = np.sort(a, axis=1)  # NaN sort last
    ok = n > 0
    r = np.flatnonzero(ok)
    lo = s[r, (n[r] - 1) // 2]
    hi = s[r, n[r] // 2]
    out[r] = 0.5 * (lo + hi)
    return out


TREND_Z = 2.0
"""Standard errors by which the second half of the samples before a candidate must sit above (or below) the
first half for the verification to extrapolate their trend."""


def _line_level(y: FloatArray, bt: FloatArray, at: FloatArray, own: NDArray[np.bool_]) -> FloatArray:
    """Where a robust line through ``y`` (NaN = absent; ``bt`` the time indices) stands at the median of ``at``.

    Its slope joins the medians (of value and of time) of the first and second half of the samples. Medians
    of halves ignore the spikes a least-squares fit would follow. The slope is kept only where the rise
    between the halves stands ``TREND_Z`` standard errors (of a difference of two medians, from the scatter
    about a line through their overall median) out of the noise, and with at least four samples: on a flat
    series jitter does not tilt the line.

    The line passes through the median of the samples ``own`` (all of ``y`` but where
    :func:`_trend_levels` says otherwise) at their median time.
    """
    ok = ~np.isnan(y)
    nb = ok.sum(axis=1)
    rank = np.cumsum(ok, axis=1) - 1
    half = (nb // 2)[:, None]
    first = ok & (rank < half)
    second = ok & (rank >= nb[:, None] - half)
    m1 = _nanmedian_rows(np.where(first, y, np.nan))
    m2 = _nanmedian_rows(np.where(second, y, np.nan))
    t1 = _nanmedian_rows(np.where(first, bt, np.nan))
    t2 = _nanmedian_rows(np.where(second, bt, np.nan))
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(nb >= 4, (m2 - m1) / (t2 - t1), 0.0)
    slope = np.where(np.isfinite(slope), slope, 0.0)
    my = _nanmedian_rows(y)
    tb = _nanmedian_rows(np.where(ok, bt, np.nan))
    resid = y - (my[:, None] + slope[:, None] * (bt - tb[:, None]))
    sigma = 1.4826 * _nanmedian_rows(np.abs(resid))
    with np.errstate(invalid="ignore", divide="ignore"):
        se = 1.2533 * sigma * np.sqrt(2.0 / np.maximum(nb // 2, 1))
        steady = np.abs(m2 - m1) > TREND_Z * se
    slope = np.where(steady, slope, 0.0)
    mine = ok & own
    my_own = _nanmedian_rows(np.where(mine, y, np.nan))
    tb_own = _nanmedian_rows(np.where(mine, bt, np.nan))
    # (No sample of the regime among y cannot happen for a candidate, which needs min_before of them.)
    my_own = np.where(np.isnan(my_own), my, my_own)
    tb_own = np.where(np.isnan(tb_own), tb, tb_own)
    out: FloatArray = my_own + slope * (_nanmedian_rows(at) - tb_own)
    return out


def _trend_levels(before: FloatArray, bt: FloatArray, at: FloatArray, start: IntArray,
                  ma: FloatArray) -> FloatArray:
    """The levels the regime before a candidate would have reached by the samples after it, had it gone on.

    Two extrapolations, one column each: an additive trend (a straight line through the samples before)
    and, where every sample before is positive, a multiplicative one (a straight line through their
    logarithms: growth by a steady factor, which a straight line falls behind); elsewhere the second
    column repeats the first. ``bt``/``at``: time indices of the samples before/after (NaN = absent);
    ``start``: first time index of the current regime; ``ma``: the level after.

    The samples before reach back across the last confirmed change (at ``start``) so that one stair of a
    staircase does not hide the slope the next stair continues; the lines then pass through the median of
    all of them. A candidate that goes back toward the level from before that change does not continue it,
    it ends the excursion: for it the lines pass through the median of the current regime's own samples.
    Through the median of all, after a slowdown of a few samples, they stood at the healthy level from
    before the slowdown (most of the samples), so its end, a return to exactly that level, never stood off
    the "trend" and the event stayed open. Where the regime holds every sample before, both are the same.
    """
    with np.errstate(invalid="ignore"):
        own = bt >= np.asarray(start, dtype=np.float64)[:, None]
        m_own = _nanmedian_rows(np.where(own, before, np.nan))
        m_pre = _nanmedian_rows(np.where(~own, before, np.nan))
        back = np.sign(ma - m_own) * np.sign(m_pre - m_own) > 0  # False where no sample precedes the regime
    own = own | ~back[:, None]
    lin = _line_level(before, bt, at, own)
    with np.errstate(invalid="ignore", divide="ignore"):
        positive = np.all(np.isnan(before) | (before > 0), axis=1)
        logy = np.log(np.where(positive[:, None] & (before > 0), before, np.nan))
        mult = np.exp(_line_level(logy, bt, at, own))
    return np.stack([lin, np.where(positive & np.isfinite(mult), mult, lin)], axis=1)


def _beyond_trend(mb: FloatArray, ma: FloatArray, trends: FloatArray, se: FloatArray,
                  v: VerifyConfig) -> NDArray[np.bool_]:
    """Whether the level after also departs from every trend before, by as much and on the same side.

    A steady rise (a growing series, a ramp of the batch size) moves the median after away from the
    median before by however far the trend ran in between; it is not a change. A change must stand off
    the flat level *and* each extrapolated trend (``trends``, one column each) by ``threshold`` of the
    level before and ``z`` standard errors.
    """
    d = ma[:, None] - trends
    with np.errstate(invalid="ignore"):
        each = ((np.abs(d) >= v.threshold * np.abs(mb)[:, None]) & (np.abs(d) >= v.z * se[:, None])
                & (np.sign(d) == np.sign(ma - mb)[:, None]))
    out: NDArray[np.bool_] = each.all(axis=1)
    return out


def _lagged(d: FloatArray, first: IntArray, count: IntArray, lag: int, width: int) -> FloatArray:
    """``d[:, k + lag]`` for ``k`` in ``first .. first + count - 1`` (up to ``width`` per row), NaN elsewhere."""
    k = first[:, None] + np.arange(width)[None, :] + lag
    ok = (np.arange(width)[None, :] < count[:, None]) & (k < d.shape[1])
    got = np.take_along_axis(d, np.clip(k, 0, d.shape[1] - 1), axis=1)
    out: FloatArray = np.where(ok, got, np.nan)
    return out


def _by_age(vals: FloatArray, times: NDArray[np.integer[Any]], t: int, width: int) -> FloatArray:
    """Samples laid out by age (column ``k`` = taken at ``t - k``), NaN where none is held."""
    age = t - np.asarray(times, dtype=np.int64)
    ok = (np.asarray(times) >= 0) & (age >= 0) & (age < width) & ~np.isnan(vals)
    out = np.full((vals.shape[0], width), np.nan)
    r, j = np.nonzero(ok)
    out[r, age[r, j]] = vals[r, j]
    return out


def _seasonal(d: FloatArray, n_after: IntArray, regime: IntArray, mb: FloatArray,
              v: VerifyConfig) -> NDArray[np.bool_]:
    """Whether the new regime repeats what the series did one period earlier, for a period it already showed.

    ``d[:, k]`` is the sample taken ``k`` steps before the latest one (NaN when missing or no longer held);
    the new regime is ``k < n_after``. For a lag ``P`` (at least ``n_after``, so the lagged samples all
    precede the change, and small enough that ``n_min`` samples before the change have partners ``P``
    earlier in the held history: up to ``history - 2 n_min`` = 39 samples by default) the regime is
    seasonal when its samples match those ``P`` steps earlier (median absolute difference under half the
    threshold) *and* the samples before the change match theirs ``P`` steps earlier too: the series was
    already repeating itself with that period. A level shift
    matches neither (the lagged samples are the old level); a flat series matches itself at every lag
    before the change but not after it.

    ``regime``: ages below it (``k < regime``) belong to the regime since the last confirmed change. Those
    of its samples that are among the samples before the change must match theirs ``P`` earlier as well:
    a periodic series repeats itself in any stretch. Otherwise, after a slowdown of a few samples, the
    samples before its end would be mostly the healthy level from before it (matching its lag), its end
    (back to that level) would match the samples ``P`` earlier, and the end would pass for a season.
    """
    tol = 0.5 * v.threshold * np.abs(mb)
    out = np.zeros(d.shape[0], dtype=bool)
    zero = np.zeros(d.shape[0], dtype=np.int64)
    cur_after = _lagged(d, zero, n_after, 0, v.n_max)
    own = np.arange(v.n_max)[None, :] < (regime - n_after)[:, None]  # columns of cur_bef in the regime
    for lag in range(v.n_min, d.shape[1] - 2 * v.n_min + 1):
        room = d.shape[1] - lag - n_after  # samples before the change that still have a lagged partner
        n_bef = np.minimum(v.n_max, room)
        usable = (n_after <= lag) & (n_bef >= v.n_min)
        if not usable.any():
            continue
        lag_after = _lagged(d, zero, n_after, lag, v.n_max)
        cur_bef = _lagged(d, n_after, np.maximum(n_bef, 0), 0, v.n_max)
        lag_bef = _lagged(d, n_after, np.maximum(n_bef, 0), lag, v.n_max)
        with np.errstate(invalid="ignore"):
            da = _nanmedian_rows(np.abs(cur_after - lag_after))
            dif = np.abs(cur_bef - lag_bef)
            db = _nanmedian_rows(dif)
            mine = np.where(own, dif, np.nan)
            d_own = np.where(np.isnan(mine).all(axis=1), 0.0, _nanmedian_rows(mine))
            out |= usable & (da <= tol) & (db <= tol) & (d_own <= tol)
    return out


def _ends_event(tracker: EventTracker, rows: IntArray, ma: FloatArray) -> NDArray[np.bool_]:
    """Whether a change of `rows` to the levels `ma` would end their open fail-slow events.

    The trend and season checks keep a trend, a drift or a season from opening an event or moving the
    reference; they do not judge the end of an event. A recovery in stairs (a mitigation undone step by step:
    1.03, 0.70, 0.59, 0.45, then 0.38 s against 0.42 s healthy, on the testbed) reads as a trend the next
    stair continues, so with the checks its last stairs were never confirmed and the event never closed.
    """
    out: NDArray[np.bool_] = tracker.would_end(rows, ma)
    return out


def _consistent(after: FloatArray, mb: FloatArray, ma: FloatArray, threshold: float, q: float) -> NDArray[np.bool_]:
    """Whether the new regime is shifted as a whole, not just its median.

    For a rise, the ``q`` quantile of the samples after the change must already sit 60 % of the threshold
    above the level before (for a fall, the ``1 - q`` quantile as far below). Heavy-tailed
    jitter can lift the median of five samples by 10 % with three outliers; it cannot lift four of them.
    """
    n = np.sum(~np.isnan(after), axis=1)
    srt = np.sort(after, axis=1)  # NaN last
    k = np.floor(q * np.maximum(n - 1, 0)).astype(np.int64)
    rows = np.arange(after.shape[0])
    low = srt[rows, np.clip(k, 0, after.shape[1] - 1)]
    high = srt[rows, np.clip(n - 1 - k, 0, after.shape[1] - 1)]
    margin = 0.6 * threshold * np.abs(mb)
    with np.errstate(invalid="ignore"):
        shifted: NDArray[np.bool_] = np.where(ma > mb, low >= mb + margin, high <= mb - margin) & (n > 0)
    return shifted


@dataclass
class _BOCDBase:
    n_series: int
    bocd: BOCDConfig = field(default_factory=BOCDConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)

    def __post_init__(self) -> None:
        self._model = BOCD(self.n_series, self.bocd)
        self._hist = History(self.n_series, self.verify.history)
        self._tracker = EventTracker(self.n_series, self._event_threshold(), self._event_settle())
        self._start = np.zeros(self.n_series, dtype=np.int64)  # first index of the current regime
        self.t = -1

    def _event_threshold(self) -> float:
        return self.verify.threshold

    def _event_settle(self) -> int:
        return SETTLE

    def grow(self, n_series: int) -> None:
        """Append fresh series (they start their first regime at the next sample)."""
        if n_series <= self.n_series:
            return
        extra = n_series - self.n_series
        self._model.grow(n_series)
        self._hist.grow(n_series)
        self._tracker.grow(n_series)
        self._start = np.concatenate([self._start, np.full(extra, self.t + 1, dtype=np.int64)])
        self.n_series = n_series

    def state_dict(self) -> dict[str, Any]:
        """Model, history, regime starts and event state."""
        st: dict[str, Any] = {f"bocd.{k}": v for k, v in self._model.state_dict().items()}
        st.update({f"events.{k}": v for k, v in self._tracker.state_dict().items()})
        st.update(self._hist.state())
        st["start"] = self._start
        st["t"] = np.int64(self.t)
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        self._model.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("bocd.")})
        self._tracker.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("events.")})
        self._hist.load_state(state, self.n_series)
        self._start = np.array(state["start"], dtype=np.int64)
        self.t = int(state["t"])

    def _levels(self, rows: IntArray, c: IntArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray,
                                                              FloatArray, FloatArray]:
        """Medians before/after candidate starts ``c``, their sample counts, the spread before and the
        samples after."""
        v = self.verify
        before = self._hist.window(rows, self._start[rows], c, v.before)
        after = self._hist.window(rows, c, np.full(rows.shape[0], self.t + 1, dtype=np.int64), v.n_max)
        mb = _nanmedian_rows(before)
        ma = _nanmedian_rows(after)
        nb = np.sum(~np.isnan(before), axis=1).astype(np.float64)
        na = np.sum(~np.isnan(after), axis=1).astype(np.float64)
        mad = _nanmedian_rows(np.abs(before - mb[:, None]))
        return mb, ma, nb, na, mad, after

    def _trends(self, rows: IntArray, c: IntArray, ma: FloatArray) -> FloatArray:
        """:func:`_trend_levels` for candidate starts ``c``.

        The trend is read from the last ``before`` samples before ``c`` across earlier confirmed changes
        too: after one stair of a staircase (a batch-size ramp, a growing series) the regime since it is
        too short to show the trend that the next stair continues.
        """
        v = self.verify
        lead, lt = self._hist.window_at(rows, np.zeros(rows.shape[0], dtype=np.int64), c, v.before)
        _, at = self._hist.window_at(rows, c, np.full(rows.shape[0], self.t + 1, dtype=np.int64), v.n_max)
        return _trend_levels(lead, lt, at, self._start[rows], ma)

    def _lags(self, rows: IntArray) -> FloatArray:
        """The held samples of ``rows`` by age: column ``k`` is the sample taken ``k`` steps before the latest."""
        vals, times = self._hist.recent(rows, self._hist.width), self._hist.recent_times(rows, self._hist.width)
        return _by_age(vals, times, self.t, self._hist.width)

    def _verdict(self, changed: NDArray[np.bool_], index: IntArray, prob: FloatArray, lb: FloatArray,
                 la: FloatArray) -> BatchVerdict:
        opened, recovered = self._tracker.observe(changed, index, lb, la)
        return BatchVerdict(t=self.t, changed=changed, index=index, probability=prob, level_before=lb,
                            level_after=la, failslow=self._tracker.open.copy(), opened=opened,
                            recovered=recovered, onset=self._tracker.onset.copy(),
                            slowdown=self._tracker.slowdown(), baseline=self._tracker.open_baseline())

    def _step(self, x: NDArray[np.floating[Any]]) -> tuple[FloatArray, IntArray, FloatArray]:
        xv = np.asarray(x, dtype=np.float64).reshape(-1)
        if xv.shape[0] != self.n_series:
            raise InputError(f"expected {self.n_series} samples, got {xv.shape[0]}")
        step = self._model.update(xv)
        self.t += 1
        self._hist.push(self.t, xv)
        return xv, step.run_length, step.probability


@dataclass
class VerifiedBOCD(_BOCDBase):
    """BOCD+V: BOCD candidates confirmed by a robust ≥ threshold level change (see module docstring)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._ref = np.full(self.n_series, np.nan)
        self._ref_n = np.zeros(self.n_series, dtype=np.int64)

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.n_series
        super().grow(n_series)
        if extra > 0:
            self._ref = np.concatenate([self._ref, np.full(extra, np.nan)])
            self._ref_n = np.concatenate([self._ref_n, np.zeros(extra, dtype=np.int64)])

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the reference level of the persistence check."""
        st = super().state_dict()
        st["ref"] = self._ref
        st["ref_n"] = self._ref_n
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        super().load_state_dict(state)
        self._ref = np.array(state["ref"], dtype=np.float64)
        self._ref_n = np.array(state["ref_n"], dtype=np.int64)

    def _persistent(self, cand: NDArray[np.bool_]) -> tuple[IntArray, IntArray]:
        """Series whose last ``n_min`` observed samples all sit ≥ threshold on one side of the reference level.

        BOCD misses a change when an early outlier (a slow first iteration) inflated the variance of
        the current run; this cheap check proposes such changes to the same verification. The
        candidate start is the earliest sample of the unbroken run of deviating samples.
        """
        v = self.verify
        dev = self._hist.recent(None, v.n_min) - self._ref[:, None]
        lim = v.threshold * np.abs(self._ref)
        with np.errstate(invalid="ignore"):
            up = np.all(dev > lim[:, None], axis=1)
            down = np.all(dev < -lim[:, None], axis=1)
        # (A series with fewer than n_min samples has NaN among them: neither up nor down.)
        rows = np.flatnonzero((up | down) & ~cand & (self._ref_n >= v.min_before))
        if rows.size:
            first = self._hist.recent_times(rows, v.n_min)[:, 0]
            rows = rows[first - self._start[rows] >= v.min_before]
        if rows.size == 0:
            return rows, rows
        vals, times = self._hist.recent(rows, v.n_max), self._hist.recent_times(rows, v.n_max)
        d = vals - self._ref[rows, None]
        sign = np.where(up[rows], 1.0, -1.0)[:, None]
        with np.errstate(invalid="ignore"):
            beyond = (d * sign > lim[rows, None]) & (times >= self._start[rows, None] + v.min_before)
        # Length of the all-True suffix of each row (at least n_min: the last n_min samples qualified);
        # the candidate starts at the first sample of it.
        suffix = np.argmin(beyond[:, ::-1], axis=1)
        suffix = np.where(beyond.all(axis=1), v.n_max, suffix)
        return rows, times[np.arange(rows.size), v.n_max - suffix].astype(np.int64)

    def _update_ref(self, xv: FloatArray) -> None:
        ok = ~np.isnan(xv)
        fresh = ok & (self._ref_n == 0)
        self._ref[fresh] = xv[fresh]
        self._ref_n[ok] += 1
        w = np.maximum(1.0 / np.maximum(self._ref_n, 1), self.bocd.ew)
        self._ref = np.where(ok, self._ref + w * (np.where(ok, xv, 0.0) - self._ref), self._ref)

    def update(self, x: NDArray[np.floating[Any]]) -> BatchVerdict:
        """Consume one sample per series (NaN = missing)."""
        xv, run, prob = self._step(x)
        v, s = self.verify, self.n_series
        t = self.t
        c = t - run
        n_after = run + 1
        cand = ((n_after >= v.n_min) & (n_after <= v.n_max) & (run < self.bocd.max_run - 1)
                & (c - self._start >= v.min_before))
        # The fallback only where BOCD has not itself started a new run since the regime began.
        stale = (n_after > v.n_max) | (c - self._start < v.min_before)
        extra_rows, extra_c = self._persistent(cand | ~stale)
        if extra_rows.size:
            c = c.copy()
            c[extra_rows] = extra_c
            cand = cand.copy()
            cand[extra_rows] = True
            prob = prob.copy()
            prob[extra_rows] = self._model.start_probability(extra_rows, t - extra_c)
        self._update_ref(xv)
        changed = np.zeros(s, dtype=bool)
        index = np.full(s, -1, dtype=np.int64)
        p = np.full(s, np.nan)
        lb = np.full(s, np.nan)
        la = np.full(s, np.nan)
        if cand.any():
            rows = np.flatnonzero(cand)
            mb, ma, nb, na, mad, after = self._levels(rows, c[rows])
            # The spread is the larger of the two regimes': a change must stand out of the noise of both.
            mad_a = _nanmedian_rows(np.abs(after - ma[:, None]))
            sigma = np.maximum(1.4826 * np.fmax(mad, mad_a), self.bocd.scale_floor * np.abs(mb))
            diff = np.abs(ma - mb)
            with np.errstate(invalid="ignore", divide="ignore"):
                se = sigma * np.sqrt(1.0 / np.maximum(na, 1.0) + 1.0 / np.maximum(nb, 1.0))
                ok = ((na >= v.n_min) & (nb >= v.min_before) & (diff >= v.threshold * np.abs(mb))
                      & (diff >= v.z * se) & (diff > 0)
                      & _consistent(after, mb, ma, v.threshold, v.consistency))
            # The costlier trend and season checks only for what passed the rest, and never for a change
            # that ends an open event (:func:`_ends_event`).
            free = ok & ~_ends_event(self._tracker, rows, ma)
            if free.any():
                sub = np.flatnonzero(free)
                ok[sub] = _beyond_trend(mb[sub], ma[sub], self._trends(rows[sub], c[rows[sub]], ma[sub]),
                                        se[sub], v)
            free &= ok
            if free.any():
                sub = np.flatnonzero(free)
                ok[sub] = ~_seasonal(self._lags(rows[sub]), t + 1 - c[rows[sub]],
                                    t + 1 - self._start[rows[sub]], mb[sub], v)
            hit = rows[ok]
            changed[hit] = True
            index[hit] = c[hit]
            p[hit] = prob[hit]
            lb[hit] = mb[ok]
            la[hit] = ma[ok]
            self._start[hit] = c[hit]
            self._ref[hit] = ma[ok]
            # A persistence candidate that is no change means the reference level was wrong (a first
            # iteration 100x slower than the rest keeps an average high for a hundred samples): it becomes
            # the level the samples now sit at, so the next real change is measured from there.
            stray = np.isin(rows, extra_rows) & ~ok & (na >= v.n_min) & (nb >= v.min_before)
            self._ref[rows[stray]] = ma[stray]
        return self._verdict(changed, index, p, lb, la)


@dataclass
class PlainBOCD(_BOCDBase):
    """Plain BOCD: every restart of the MAP run length at a new sample is a change (FALCON's baseline)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._last = np.zeros(self.n_series, dtype=np.int64)

    def _event_threshold(self) -> float:
        # Without verification any rise is a slowdown alarm; that is what makes this a baseline.
        return 0.0

    def _event_settle(self) -> int:
        # Any rise, also the end of a speed-up: FALCON's baseline as it was defined.
        return 0

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.n_series
        super().grow(n_series)
        if extra > 0:
            self._last = np.concatenate([self._last, np.full(extra, self.t + 1, dtype=np.int64)])

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the last reported regime start."""
        st = super().state_dict()
        st["last"] = self._last
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        super().load_state_dict(state)
        self._last = np.array(state["last"], dtype=np.int64)

    def update(self, x: NDArray[np.floating[Any]]) -> BatchVerdict:
        """Consume one sample per series (NaN = missing)."""
        xv, run, prob = self._step(x)
        s, t = self.n_series, self.t
        c = t - run
        new = (c > self._last) & (run < self.bocd.max_run - 1) & ~np.isnan(xv)
        changed = np.zeros(s, dtype=bool)
        index = np.full(s, -1, dtype=np.int64)
        p = np.full(s, np.nan)
        lb = np.full(s, np.nan)
        la = np.full(s, np.nan)
        if new.any():
            rows = np.flatnonzero(new)
            mb, ma, _, _, _, _ = self._levels(rows, c[rows])
            ok = ~np.isnan(mb) & ~np.isnan(ma)
            hit = rows[ok]
            changed[hit] = True
            index[hit] = c[hit]
            p[hit] = prob[hit]
            lb[hit] = mb[ok]
            la[hit] = ma[ok]
            self._last[rows] = c[rows]
            self._start[hit] = c[hit]
        return self._verdict(changed, index, p, lb, la)


# --------------------------------------------------------------------------- batch forms of one series
Change = tuple[int, int, float, float, float]  # (detected_at, index, probability, level_before, level_after)


def _levels_1d(x: FloatArray, obs: IntArray, start: int, c: int,
               v: VerifyConfig) -> tuple[float, float, int, int, float, FloatArray]:
    """:meth:`_BOCDBase._levels` of one series; ``obs`` are the time indices of its last ``v.history``
    observed samples (what :class:`History` holds)."""
    b = obs[(obs >= start) & (obs < c)][-v.before:]
    before = x[b][None, :]
    after = x[obs[obs >= c][-v.n_max:]][None, :]
    mb = float(_nanmedian_rows(before)[0]) if before.shape[1] else float("nan")
    ma = float(_nanmedian_rows(after)[0]) if after.shape[1] else float("nan")
    nb = int(before.shape[1])
    na = int(after.shape[1])
    mad = float(_nanmedian_rows(np.abs(before - mb))[0]) if before.shape[1] else float("nan")
    return mb, ma, nb, na, mad, after


def _trends_1d(x: FloatArray, obs: IntArray, start: int, c: int, ma: float, v: VerifyConfig) -> FloatArray:
    """:meth:`_BOCDBase._trends` of one series (``obs`` as for :func:`_levels_1d`)."""
    lead = obs[obs < c][-v.before:]
    a = obs[obs >= c][-v.n_max:]
    return _trend_levels(x[lead][None, :], lead.astype(np.float64)[None, :], a.astype(np.float64)[None, :],
                         np.array([start]), np.array([ma]))


class _Observed:
    """The time indices of the last ``width`` observed samples of one series, as :class:`History` keeps."""

    def __init__(self, x: FloatArray, width: int) -> None:
        self.idx = np.flatnonzero(~np.isnan(x))
        self.width = width

    def upto(self, t: int) -> IntArray:
        """Indices of the last ``width`` observed samples taken at or before ``t``."""
        k = int(np.searchsorted(self.idx, t, side="right"))
        return self.idx[max(0, k - self.width):k]


def verified_changes(x: NDArray[np.floating[Any]], bocd: BOCDConfig | None = None,
                     verify: VerifyConfig | None = None) -> list[Change]:
    """BOCD+V over one whole series: the same decisions as :class:`VerifiedBOCD`, sample by sample."""
    from failslow.bocd import run_lengths
    bcfg, v = bocd or BOCDConfig(), verify or VerifyConfig()
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    tr = run_lengths(xs, bcfg)
    out: list[Change] = []
    start = 0
    last_bin = bcfg.max_run - 1
    run_arr = tr.run_length
    ref, ref_n = float("nan"), 0
    thr = v.threshold
    seen = _Observed(xs, v.history)
    events = EventTracker(1, v.threshold)  # what detect_series makes of the changes, for _ends_event
    zero, one = np.zeros(1, dtype=np.int64), np.ones(1, dtype=bool)
    for t in range(xs.shape[0]):
        run = int(run_arr[t])
        c = t - run
        prob = float(tr.probability[t])
        is_cand = v.n_min <= run + 1 <= v.n_max and run < last_bin and c - start >= v.min_before
        persisted = False
        stale = run + 1 > v.n_max or c - start < v.min_before
        obs = seen.upto(t)
        if (not is_cand and stale and ref_n >= v.min_before and obs.size >= v.n_min
                and int(obs[-v.n_min]) - start >= v.min_before):
            rec = xs[obs[-v.n_min:]] - ref
            lim = thr * abs(ref)
            up, down = bool(np.all(rec > lim)), bool(np.all(rec < -lim))
            if up or down:
                sign = 1.0 if up else -1.0
                k = 0
                while k < min(v.n_max, obs.size):
                    i = int(obs[-1 - k])
                    if i < start + v.min_before or not (xs[i] - ref) * sign > lim:
                        break
                    k += 1
                c = int(obs[-k])
                prob = float(tr.cdf[t, min(t - c, last_bin)])
                is_cand = persisted = True
        xt = xs[t]
        if xt == xt:
            if ref_n == 0:
                ref = float(xt)
            ref_n += 1
            ref += max(1.0 / ref_n, bcfg.ew) * (float(xt) - ref)
        if not is_cand:
            continue
        mb, ma, nb, na, mad, after = _levels_1d(xs, obs, start, c, v)
        mad_a = float(_nanmedian_rows(np.abs(after - ma))[0]) if after.shape[1] else float("nan")
        sigma = max(1.4826 * float(np.fmax(mad, mad_a)), bcfg.scale_floor * abs(mb))
        diff = abs(ma - mb)
        se = sigma * float(np.sqrt(1.0 / max(na, 1) + 1.0 / max(nb, 1)))
        mba, maa = np.array([mb]), np.array([ma])
        if na >= v.n_min and nb >= v.min_before and diff >= v.threshold * abs(mb) and diff >= v.z * se \
                and diff > 0 and bool(_consistent(after, mba, maa, v.threshold, v.consistency)[0]) \
                and (bool(_ends_event(events, zero, maa)[0])
                     or (bool(_beyond_trend(mba, maa, _trends_1d(xs, obs, start, c, ma, v), np.array([se]), v)[0])
                     and not bool(_seasonal(_by_age(xs[obs][None, :], obs[None, :], t, v.history),
                                            np.array([t + 1 - c]), np.array([t + 1 - start]), mba, v)[0]))):
            out.append((t, c, prob, mb, ma))
            events.observe(one, np.array([c]), mba, maa)
            start = c
            ref = ma
        elif persisted and na >= v.n_min and nb >= v.min_before:
            ref = ma
    return out


def plain_changes(x: NDArray[np.floating[Any]], bocd: BOCDConfig | None = None,
                  verify: VerifyConfig | None = None) -> list[Change]:
    """Plain BOCD over one whole series: the same reports as :class:`PlainBOCD`, sample by sample."""
    from failslow.bocd import run_lengths
    bcfg, v = bocd or BOCDConfig(), verify or VerifyConfig()
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    tr = run_lengths(xs, bcfg)
    out: list[Change] = []
    start = last = 0
    c_all = np.arange(xs.shape[0]) - tr.run_length
    seen = _Observed(xs, v.history)
    for t in np.flatnonzero((tr.run_length < bcfg.max_run - 1) & ~np.isnan(xs)).tolist():
        c = int(c_all[t])
        if c <= last:
            continue
        last = c
        mb, ma, _, _, _, _ = _levels_1d(xs, seen.upto(t), start, c, v)
        if mb == mb and ma == ma:
            out.append((t, c, float(tr.probability[t]), mb, ma))
            start = c
    return out
