"""Sliding-window median baseline: the simple detector FALCON compares BOCD+V against.

What it is for: a reference point in the evaluation table. Each new sample compares the median of the last
``width`` observed samples with the median of the ``width`` observed samples before them (a missing sample
takes no room, so a gap never leaves a window without the regime before it); a relative difference of at least
``threshold`` (10 %) is a change whose first sample is estimated at ``t - width // 2`` (the median flips
once half of the recent window belongs to the new regime) and the new level is the median of the newest
``width // 2`` samples. After a report the detector waits until the
older window holds only samples after the change, so one step is not reported twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.detect.base import BatchVerdict, Change, no_changes
from failslow.detect.events import EventTracker
from failslow.detect.history import History
from failslow.errors import InputError


@dataclass
class WindowMedian:
    """Median of the last ``width`` samples against the ``width`` before, per series, vectorised.

    Args:
        n_series: Number of series updated in lock step.
        width: Samples per window.
        threshold: Relative level change that counts as a change point.
    """

    n_series: int
    width: int = 10
    threshold: float = 0.10

    def __post_init__(self) -> None:
        if self.n_series < 1:
            raise InputError("n_series must be positive")
        if self.width < 2:
            raise InputError(f"width must be at least 2, got {self.width}")
        if self.threshold <= 0:
            raise InputError("threshold must be positive")
        self._hist = History(self.n_series, 2 * self.width)
        # Ordinal (0, 1, ...) of a series' observed sample from which it is examined again.
        self._armed_at = np.full(self.n_series, 2 * self.width - 1, dtype=np.int64)
        self._tracker = EventTracker(self.n_series, self.threshold)
        self.t = -1

    def seek(self, t: int) -> None:
        """Set the clock of a detector that has consumed nothing yet: its next sample gets index ``t + 1``."""
        self.t = t

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.n_series
        if extra <= 0:
            return
        self._hist.grow(n_series)
        self._armed_at = np.concatenate([self._armed_at, np.full(extra, 2 * self.width - 1, dtype=np.int64)])
        self._tracker.grow(n_series)
        self.n_series = n_series

    def state_dict(self) -> dict[str, Any]:
        """Windows, re-arm ordinals and event state."""
        st: dict[str, Any] = {f"events.{k}": v for k, v in self._tracker.state_dict().items()}
        st.update(self._hist.state())
        st.update({"armed_at": self._armed_at, "t": np.int64(self.t)})
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        self._hist.load_state(state, self.n_series)
        self._armed_at = np.array(state["armed_at"], dtype=np.int64)
        self._tracker.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("events.")})
        self.t = int(state["t"])

    def update(self, x: NDArray[np.floating[Any]]) -> BatchVerdict:
        """Consume one sample per series (NaN = missing)."""
        xv = np.asarray(x, dtype=np.float64).reshape(-1)
        if xv.shape[0] != self.n_series:
            raise InputError(f"expected {self.n_series} samples, got {xv.shape[0]}")
        w, s = self.width, self.n_series
        self.t += 1
        self._hist.push(self.t, xv)
        changed, index, _, lb, la = no_changes(s)
        # Only a new sample moves a series' windows.
        due = ~np.isnan(xv) & (self._armed_at <= self._hist.n - 1)
        if due.any():
            rows = np.flatnonzero(due)
            vals = self._hist.recent(rows, 2 * w)
            old, new = vals[:, :w], vals[:, w:]
            mn, mo = np.median(new, axis=1), np.median(old, axis=1)
            ok = (np.abs(mn - mo) >= self.threshold * np.abs(mo)) & (mn != mo)
            hit = rows[ok]
            changed[hit] = True
            index[hit] = self._hist.recent_times(hit, 2 * w)[:, 2 * w - 1 - w // 2]
            lb[hit] = mo[ok]
            # The newest half of the recent window lies after the estimated change: its median is the level.
            la[hit] = np.median(new[ok][:, w - w // 2:], axis=1)
            # Wait until the older window lies wholly after the reported change.
            self._armed_at[hit] = self._hist.n[hit] - 1 + w + w // 2
        p = np.where(changed, 1.0, np.nan)
        opened, recovered = self._tracker.observe(changed, index, lb, la)
        return BatchVerdict(t=self.t, changed=changed, index=index, probability=p, level_before=lb,
                            level_after=la, failslow=self._tracker.open.copy(), opened=opened,
                            recovered=recovered, onset=self._tracker.onset.copy(),
                            slowdown=self._tracker.slowdown(), baseline=self._tracker.open_baseline())


def window_changes(x: NDArray[np.floating[Any]], width: int = 10, threshold: float = 0.10) -> list[Change]:
    """The window method over one whole series: the same reports as :class:`WindowMedian`.

    Returns ``(detected_at, index, probability, level_before, level_after)`` per change.
    """
    WindowMedian(1, width=width, threshold=threshold)  # validates the parameters
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    obs = np.flatnonzero(~np.isnan(xs))  # the windows hold observed samples only
    y = xs[obs]
    n, w = y.shape[0], width
    if n < 2 * w:
        return []
    med = np.median(np.lib.stride_tricks.sliding_window_view(y, w), axis=1)  # med[i]: y[i:i+w]
    half = np.median(np.lib.stride_tricks.sliding_window_view(y, w // 2), axis=1)
    out: list[Change] = []
    armed = 2 * w - 1
    i_idx = np.arange(2 * w - 1, n)
    mn_all, mo_all = med[i_idx - w + 1], med[i_idx - 2 * w + 1]
    ok_all = (np.abs(mn_all - mo_all) >= threshold * np.abs(mo_all)) & (mn_all != mo_all)
    for k in np.flatnonzero(ok_all).tolist():
        i = int(i_idx[k])
        if i < armed:
            continue
        out.append((int(obs[i]), int(obs[i - w // 2]), 1.0, float(mo_all[k]), float(half[i - w // 2 + 1])))
        armed = i + w + w // 2
    return out
