"""The verification's parameters and its checks beyond the level test: trend, season, a whole-regime shift.

What it is for: a candidate change of BOCD+V (:mod:`failslow.detect.bocdv`) is confirmed only when its level
after stands off the level before by ``threshold`` and ``z`` standard errors (:class:`VerifyConfig`), the
new regime moved as a whole (:func:`_consistent`), the level after also stands off where the trend before
would have taken the old regime (:func:`_beyond_trend`, through :func:`_trend_levels`), and it does not
repeat what the series did one period earlier when it was already repeating itself (:func:`_seasonal`).
None of the trend and season checks judges the end of an open event (:func:`_ends_event`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from failslow.detect.base import FloatArray, IntArray
from failslow.detect.events import EventTracker
from failslow.detect.history import _nanmedian_rows
from failslow.errors import InputError


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
