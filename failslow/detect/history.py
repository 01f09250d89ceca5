"""The sample history the verification reads: the last observed samples of each series, with their times.

What it is for: the levels before and after a candidate change, the trend before it and the season of the
series are all read from the samples a series last *observed* (a missing sample takes no room). The
vectorised detectors keep them in :class:`History`; the batch forms of one series find the same samples with
:class:`_Observed`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.detect.base import FloatArray, IntArray
from failslow.errors import InputError


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


def _by_age(vals: FloatArray, times: NDArray[np.integer[Any]], t: int, width: int) -> FloatArray:
    """Samples laid out by age (column ``k`` = taken at ``t - k``), NaN where none is held."""
    age = t - np.asarray(times, dtype=np.int64)
    ok = (np.asarray(times) >= 0) & (age >= 0) & (age < width) & ~np.isnan(vals)
    out = np.full((vals.shape[0], width), np.nan)
    r, j = np.nonzero(ok)
    out[r, age[r, j]] = vals[r, j]
    return out


class _Observed:
    """The time indices of the last ``width`` observed samples of one series, as :class:`History` keeps."""

    def __init__(self, x: FloatArray, width: int) -> None:
        self.idx = np.flatnonzero(~np.isnan(x))
        self.width = width

    def upto(self, t: int) -> IntArray:
        """Indices of the last ``width`` observed samples taken at or before ``t``."""
        k = int(np.searchsorted(self.idx, t, side="right"))
        return self.idx[max(0, k - self.width):k]
