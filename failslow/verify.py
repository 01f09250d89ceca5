"""BOCD with verification (BOCD+V, FALCON's detector) and plain BOCD, as batch detectors.

What it is for: turning BOCD's run-length posterior into change points a human should hear about.

* **Plain BOCD** (the baseline FALCON compares against) reports a change whenever the MAP run length
  restarts at a sample later than the last reported one. It is fast to react and fooled by every spike.
* **BOCD+V** treats a restart only as a *candidate* regime start ``c``. Once at least ``n_min`` samples
  of the new regime exist it compares robust levels: the median of up to ``before`` samples preceding
  ``c`` (never crossing the last confirmed change) against the median of the samples since ``c``.
  The change is confirmed when the levels differ by at least ``threshold`` of the level before (10 % by
  default, as in FALCON) *and* by ``z`` standard errors (the spread is the MAD of the samples before), so a
  noisy series waits for a few more samples instead of paging on jitter. A candidate is re-examined as
  samples arrive, up to ``n_max`` samples after it, then dropped.

Why this survives real jobs: a checkpoint or evaluation spike every N iterations makes BOCD restart, but
a median over at least ``n_min`` samples ignores a lone spike; missing samples are NaN in the history and
ignored by the medians; warm-up shows up as a downward change (a speed-up), which never opens a fail-slow
event; slow drift never moves the median of the next few samples 10 % away from that of the previous
ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.bocd import BOCD, BOCDConfig
from failslow.detect import BatchVerdict, EventTracker
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
    """The last ``width`` raw samples of each series (NaN = missing), in a ring indexed by global time.

    Laid out time x series (``buf[t % width]`` holds every series' sample of time t): a step writes one
    contiguous row and the persistence check reads a few, instead of a strided column each.
    """

    def __init__(self, n_series: int, width: int) -> None:
        self.width = width
        self.buf = np.full((width, n_series), np.nan)

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.buf.shape[1]
        if extra > 0:
            self.buf = np.hstack([self.buf, np.full((self.width, extra), np.nan)])

    def push(self, t: int, x: FloatArray) -> None:
        """Store the samples of time ``t``."""
        self.buf[t % self.width] = x

    def rows(self) -> FloatArray:
        """One row per series (the snapshot format)."""
        return self.buf.T.copy()

    def load_rows(self, a: FloatArray) -> None:
        """Inverse of :meth:`rows`."""
        self.buf = np.ascontiguousarray(np.asarray(a, dtype=np.float64).T)

    def window(self, t: int, rows: IntArray, lo: IntArray, hi: IntArray, width: int) -> FloatArray:
        """Samples ``[max(lo, hi - width), hi)`` of each row, right-aligned, NaN-padded to ``width``."""
        idx = hi[:, None] - width + np.arange(width)[None, :]
        valid = (idx >= lo[:, None]) & (idx <= t) & (idx > t - self.width) & (idx >= 0)
        vals = self.buf[idx % self.width, rows[:, None]]
        return np.where(valid, vals, np.nan)


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
        self._tracker = EventTracker(self.n_series, self._event_threshold())
        self._start = np.zeros(self.n_series, dtype=np.int64)  # first index of the current regime
        self.t = -1

    def _event_threshold(self) -> float:
        return self.verify.threshold

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
        st["hist"] = self._hist.rows()
        st["start"] = self._start
        st["t"] = np.int64(self.t)
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        self._model.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("bocd.")})
        self._tracker.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("events.")})
        hist = np.asarray(state["hist"], dtype=np.float64)
        want = (self.n_series, self._hist.width)
        if hist.shape != want:
            raise InputError(f"history has shape {hist.shape}, expected {want}")
        self._hist.load_rows(hist)
        self._start = np.array(state["start"], dtype=np.int64)
        self.t = int(state["t"])

    def _levels(self, rows: IntArray, c: IntArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray,
                                                              FloatArray, FloatArray]:
        """Medians before/after candidate starts ``c``, their sample counts and the spread before."""
        v = self.verify
        t = self.t
        before = self._hist.window(t, rows, self._start[rows], c, v.before)
        after = self._hist.window(t, rows, c, np.full(rows.shape[0], t + 1, dtype=np.int64), v.n_max)
        mb = _nanmedian_rows(before)
        ma = _nanmedian_rows(after)
        nb = np.sum(~np.isnan(before), axis=1).astype(np.float64)
        na = np.sum(~np.isnan(after), axis=1).astype(np.float64)
        mad = _nanmedian_rows(np.abs(before - mb[:, None]))
        return mb, ma, nb, na, mad, after

    def _verdict(self, changed: NDArray[np.bool_], index: IntArray, prob: FloatArray, lb: FloatArray,
                 la: FloatArray) -> BatchVerdict:
        opened, recovered = self._tracker.observe(changed, index, lb, la)
        return BatchVerdict(t=self.t, changed=changed, index=index, probability=prob, level_before=lb,
                            level_after=la, failslow=self._tracker.open.copy(), opened=opened,
                            recovered=recovered, onset=self._tracker.onset.copy(),
                            slowdown=self._tracker.slowdown())

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
        """Series whose last ``n_min`` samples all sit ≥ threshold on one side of the reference level.

        BOCD misses a change when an early outlier (a slow first iteration) inflated the variance of
        the current run; this cheap check proposes such changes to the same verification. The
        candidate start is the earliest sample of the unbroken run of deviating samples.
        """
        v, t, width = self.verify, self.t, self._hist.width
        if t + 1 < v.n_min:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        cols = (t - v.n_min + 1 + np.arange(v.n_min)) % width
        dev = self._hist.buf[cols] - self._ref[None, :]
        lim = v.threshold * np.abs(self._ref)
        with np.errstate(invalid="ignore"):
            up = np.all(dev > lim, axis=0)
            down = np.all(dev < -lim, axis=0)
        ok = (up | down) & ~cand & (self._ref_n >= v.min_before) & (t - v.n_min + 1 - self._start >= v.min_before)
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return rows, rows
        idx = t - v.n_max + 1 + np.arange(v.n_max)
        vals = self._hist.buf[(idx % width)[None, :], rows[:, None]]
        d = vals - self._ref[rows, None]
        sign = np.where(up[rows], 1.0, -1.0)[:, None]
        with np.errstate(invalid="ignore"):
            beyond = (d * sign > lim[rows, None]) | np.isnan(vals)
        beyond &= (idx[None, :] >= self._start[rows, None] + v.min_before) & (idx[None, :] >= 0)
        # Length of the all-True suffix of each row.
        suffix = np.argmin(beyond[:, ::-1], axis=1)
        suffix = np.where(beyond.all(axis=1), v.n_max, suffix)
        return rows, (t - suffix + 1).astype(np.int64)

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
            sigma = np.maximum(1.4826 * mad, self.bocd.scale_floor * np.abs(mb))
            diff = np.abs(ma - mb)
            with np.errstate(invalid="ignore", divide="ignore"):
                se = sigma * np.sqrt(1.0 / np.maximum(na, 1.0) + 1.0 / np.maximum(nb, 1.0))
                ok = ((na >= v.n_min) & (nb >= v.min_before) & (diff >= v.threshold * np.abs(mb))
                      & (diff >= v.z * se) & (diff > 0)
                      & _consistent(after, mb, ma, v.threshold, v.consistency))
            hit = rows[ok]
            changed[hit] = True
            index[hit] = c[hit]
            p[hit] = prob[hit]
            lb[hit] = mb[ok]
            la[hit] = ma[ok]
            self._start[hit] = c[hit]
            self._ref[hit] = ma[ok]
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


def _levels_1d(x: FloatArray, t: int, start: int, c: int,
               v: VerifyConfig) -> tuple[float, float, int, int, float, FloatArray]:
    width = v.history
    lo = max(start, c - v.before, t - width + 1, 0)
    before = x[lo:c][None, :]
    after = x[max(c, t + 1 - v.n_max, t - width + 1, 0):t + 1][None, :]
    mb = float(_nanmedian_rows(before)[0]) if before.shape[1] else float("nan")
    ma = float(_nanmedian_rows(after)[0]) if after.shape[1] else float("nan")
    nb = int(np.sum(~np.isnan(before)))
    na = int(np.sum(~np.isnan(after)))
    mad = float(_nanmedian_rows(np.abs(before - mb))[0]) if before.shape[1] else float("nan")
    return mb, ma, nb, na, mad, after


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
    for t in range(xs.shape[0]):
        run = int(run_arr[t])
        c = t - run
        prob = float(tr.probability[t])
        is_cand = v.n_min <= run + 1 <= v.n_max and run < last_bin and c - start >= v.min_before
        stale = run + 1 > v.n_max or c - start < v.min_before
        if (not is_cand and stale and ref_n >= v.min_before and t + 1 >= v.n_min
                and t - v.n_min + 1 - start >= v.min_before):
            rec = xs[t - v.n_min + 1:t + 1] - ref
            lim = thr * abs(ref)
            up, down = bool(np.all(rec > lim)), bool(np.all(rec < -lim))
            if up or down:
                sign = 1.0 if up else -1.0
                k = 0
                while k < v.n_max:
                    i = t - k
                    if i < 0 or i < start + v.min_before:
                        break
                    xi = xs[i]
                    if not (xi != xi or (xi - ref) * sign > lim):
                        break
                    k += 1
                c = t - k + 1
                prob = float(tr.cdf[t, min(t - c, last_bin)])
                is_cand = True
        xt = xs[t]
        if xt == xt:
            if ref_n == 0:
                ref = float(xt)
            ref_n += 1
            ref += max(1.0 / ref_n, bcfg.ew) * (float(xt) - ref)
        if not is_cand:
            continue
        mb, ma, nb, na, mad, after = _levels_1d(xs, t, start, c, v)
        sigma = max(1.4826 * mad, bcfg.scale_floor * abs(mb))
        diff = abs(ma - mb)
        se = sigma * float(np.sqrt(1.0 / max(na, 1) + 1.0 / max(nb, 1)))
        if na >= v.n_min and nb >= v.min_before and diff >= v.threshold * abs(mb) and diff >= v.z * se \
                and diff > 0 and bool(_consistent(after, np.array([mb]), np.array([ma]), v.threshold,
                                                  v.consistency)[0]):
            out.append((t, c, prob, mb, ma))
            start = c
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
    for t in np.flatnonzero((tr.run_length < bcfg.max_run - 1) & ~np.isnan(xs)).tolist():
        c = int(c_all[t])
        if c <= last:
            continue
        last = c
        mb, ma, _, _, _, _ = _levels_1d(xs, t, start, c, v)
        if mb == mb and ma == ma:
            out.append((t, c, float(tr.probability[t]), mb, ma))
            start = c
    return out
