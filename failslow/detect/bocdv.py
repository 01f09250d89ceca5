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
  samples, and through their logarithms), and must not repeat what the series did one period earlier when
  it was already repeating itself. A candidate is re-examined as samples arrive, up to ``n_max`` samples
  after it, then dropped. The parameters (:class:`VerifyConfig`) and those checks are
  :mod:`failslow.detect.trend`; the samples they read, :mod:`failslow.detect.history`.

Why this survives real jobs: a checkpoint or evaluation spike every N iterations makes BOCD restart, but
a median over at least ``n_min`` samples ignores a lone spike; missing samples take no room in the history
(the windows are the last observed samples, so a gap of any length leaves the regime before it to compare
with); warm-up shows up as a downward change (a speed-up), which never opens a fail-slow
event; slow drift never moves the median of the next few samples 10 % away from that of the previous
ones, and a faster trend (growth, a ramp in small stairs) is extrapolated rather than taken for a change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.detect.base import BatchVerdict, Change, FloatArray, IntArray, no_changes
from failslow.detect.bocd import BOCD, BOCDConfig, run_lengths
from failslow.detect.events import SETTLE, EventTracker
from failslow.detect.history import History, _by_age, _nanmedian_rows, _Observed
from failslow.detect.trend import (
    VerifyConfig,
    _beyond_trend,
    _consistent,
    _ends_event,
    _seasonal,
    _trend_levels,
)
from failslow.errors import InputError


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

    def seek(self, t: int) -> None:
        """Set the clock of a detector that has consumed nothing yet: its next sample gets index ``t + 1``."""
        self.t = t
        self._model.t = t + 1

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
        changed, index, p, lb, la = no_changes(s)
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
        self._held_back(changed, index, p, lb, la)
        return self._verdict(changed, index, p, lb, la)

    def _held_back(self, changed: NDArray[np.bool_], index: IntArray, p: FloatArray, lb: FloatArray,
                   la: FloatArray) -> None:
        """Ends (in place) the open events whose last ``n_max`` samples all sit back, no change confirmed.

        A recovery in a long descent is never a confirmed change: the regime since the last change holds the
        whole descent, its spread is wide, and the step from its median to the level now is fewer than ``z``
        standard errors of it. The testbed's closed loop left a job at 0.35-0.41 s against 0.44 s healthy
        after a fault of 1.2 s and three splits going back (0.68, 0.62, 0.57, 0.51, 0.45, 0.55, then 0.36 s),
        and its event stayed open. ``n_max`` samples in a row back (under the threshold over the event's
        baseline, or with ``RECOVER_SHARE`` of its rise taken back) are the evidence instead: the change
        starts at the first of them, and its level after is their median.
        """
        v = self.verify
        rows = np.flatnonzero(self._tracker.open & ~changed)
        if rows.size == 0:
            return
        vals = self._hist.recent(rows, v.n_max)
        held = self._tracker.back(rows, vals).all(axis=1)
        if not held.any():
            return
        hit = rows[held]
        first = np.maximum(self._hist.recent_times(hit, v.n_max)[:, 0], self._start[hit])
        changed[hit] = True
        index[hit] = first
        p[hit] = self._model.start_probability(hit, self.t - first)
        lb[hit] = self._tracker.level[hit]
        la[hit] = _nanmedian_rows(vals[held])
        self._start[hit] = first
        self._ref[hit] = la[hit]


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
        changed, index, p, lb, la = no_changes(s)
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



def verified_changes(x: NDArray[np.floating[Any]], bocd: BOCDConfig | None = None,
                     verify: VerifyConfig | None = None) -> list[Change]:
    """BOCD+V over one whole series: the same decisions as :class:`VerifiedBOCD`, sample by sample."""
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
    bound = math.nan  # the level that ends the open event (NaN: none open)
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
        hit = False
        if is_cand:
            mb, ma, nb, na, mad, after = _levels_1d(xs, obs, start, c, v)
            mad_a = float(_nanmedian_rows(np.abs(after - ma))[0]) if after.shape[1] else float("nan")
            sigma = max(1.4826 * float(np.fmax(mad, mad_a)), bcfg.scale_floor * abs(mb))
            diff = abs(ma - mb)
            se = sigma * float(np.sqrt(1.0 / max(na, 1) + 1.0 / max(nb, 1)))
            mba, maa = np.array([mb]), np.array([ma])
            hit = na >= v.n_min and nb >= v.min_before and diff >= v.threshold * abs(mb) and diff >= v.z * se \
                and diff > 0 and bool(_consistent(after, mba, maa, v.threshold, v.consistency)[0]) \
                and (bool(_ends_event(events, zero, maa)[0])
                     or (bool(_beyond_trend(mba, maa, _trends_1d(xs, obs, start, c, ma, v), np.array([se]), v)[0])
                         and not bool(_seasonal(_by_age(xs[obs][None, :], obs[None, :], t, v.history),
                                                np.array([t + 1 - c]), np.array([t + 1 - start]), mba, v)[0])))
            if hit:
                out.append((t, c, prob, mb, ma))
                events.observe(one, np.array([c]), mba, maa)
                bound = float(events.back_bound(zero)[0])
                start = c
                ref = ma
            elif persisted and na >= v.n_min and nb >= v.min_before:
                ref = ma
        if not hit and _held_back_1d(bound, xs, obs, v):
            c = max(int(obs[-v.n_max]), start)
            ma = float(np.median(xs[obs[-v.n_max:]]))
            out.append((t, c, float(tr.cdf[t, min(t - c, last_bin)]), float(events.level[0]), ma))
            events.observe(one, np.array([c]), events.level.copy(), np.array([ma]))
            bound = float(events.back_bound(zero)[0])
            start, ref = c, ma
    return out


def _held_back_1d(bound: float, xs: FloatArray, obs: IntArray, v: VerifyConfig) -> bool:
    """:meth:`VerifiedBOCD._held_back` of one series: the last ``n_max`` samples all sit at or under `bound`
    (``EventTracker.back_bound`` of its open event; NaN when none is open)."""
    if obs.size < v.n_max or not abs(float(xs[obs[-1]])) <= bound:  # the newest first: usually all it takes
        return False
    return bool(np.all(np.abs(xs[obs[-v.n_max:]]) <= bound))


def plain_changes(x: NDArray[np.floating[Any]], bocd: BOCDConfig | None = None,
                  verify: VerifyConfig | None = None) -> list[Change]:
    """Plain BOCD over one whole series: the same reports as :class:`PlainBOCD`, sample by sample."""
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
