"""The detection protocol every change-point method implements, the verdicts it returns, and the registry.

What it is for: one shape for all detectors so the CLI, the evaluation and the service can swap them.
A method is a *batch* detector over ``n_series`` series updated in lock step (``update(x) -> BatchVerdict``
with one sample per series); :class:`Stream` turns any of them into the single-series streaming form
``update(x) -> Verdict``. :func:`detect_series` runs a whole array and returns the change points.

On top of the raw change points, :class:`EventTracker` keeps the fail-slow state of each series: a
confirmed change that lifts the level at least ``threshold`` above the healthy baseline opens an event
(the first slow sample is its onset); one that brings the level back closes it (a recovery). Speed-ups
while healthy (warm-up ending) only move the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class ChangePoint:
    """A confirmed change in one series.

    Attributes:
        index: 0-based index of the first sample of the new regime.
        probability: Posterior probability the detector gave this regime start (1.0 for the window method).
        level_before: Robust level (median) of the samples just before ``index``.
        level_after: Robust level (median) of the samples from ``index`` on, at confirmation.
        ratio: ``level_after / level_before`` (NaN when the level before is 0).
        detected_at: Index of the sample whose arrival confirmed the change.
    """

    index: int
    probability: float
    level_before: float
    level_after: float
    ratio: float
    detected_at: int


@dataclass(frozen=True)
class Verdict:
    """What one sample told a single-series detector.

    Attributes:
        t: Index of the sample just consumed.
        change: The change point confirmed by this sample, if any.
        failslow: True while a slowdown event is open.
        opened: True when this sample opened the event.
        recovered: True when this sample closed it (the slowdown ended).
        onset: Index of the first slow sample of the open event (-1 when none).
        slowdown: Current level over the healthy baseline while an event is open, else 1.0.
    """

    t: int
    change: ChangePoint | None
    failslow: bool
    opened: bool
    recovered: bool
    onset: int
    slowdown: float


@dataclass
class BatchVerdict:
    """What one lock-step sample told a batch detector, one entry per series.

    ``index`` is -1 and the float fields NaN where ``changed`` is False.
    """

    t: int
    changed: BoolArray
    index: IntArray
    probability: FloatArray
    level_before: FloatArray
    level_after: FloatArray
    failslow: BoolArray
    opened: BoolArray
    recovered: BoolArray
    onset: IntArray
    slowdown: FloatArray

    def verdict(self, i: int) -> Verdict:
        """The single-series view of series ``i``."""
        change = None
        if self.changed[i]:
            lb, la = float(self.level_before[i]), float(self.level_after[i])
            change = ChangePoint(index=int(self.index[i]), probability=float(self.probability[i]),
                                 level_before=lb, level_after=la,
                                 ratio=la / lb if lb != 0 else math.nan, detected_at=self.t)
        return Verdict(t=self.t, change=change, failslow=bool(self.failslow[i]), opened=bool(self.opened[i]),
                       recovered=bool(self.recovered[i]), onset=int(self.onset[i]),
                       slowdown=float(self.slowdown[i]))


class BatchDetector(Protocol):
    """A change-point method over ``n_series`` series updated in lock step, with bounded memory."""

    n_series: int

    def update(self, x: NDArray[np.floating[Any]]) -> BatchVerdict:
        """Consume one sample per series (NaN = missing)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Arrays and counters that let :meth:`load_state_dict` resume exactly here."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        ...

    def grow(self, n_series: int) -> None:
        """Append fresh series (new ranks) keeping the state of existing ones."""
        ...


class EventTracker:
    """Fail-slow event state per series, driven by confirmed change points.

    Args:
        n_series: Number of series.
        threshold: Relative rise over the healthy baseline that opens an event (0.10 = 10 %); the event
            closes when a later change brings the level back under it.
    """

    def __init__(self, n_series: int, threshold: float) -> None:
        if threshold < 0:
            raise InputError(f"threshold must be non-negative, got {threshold}")
        self.threshold = threshold
        self.baseline = np.full(n_series, np.nan)
        self.level = np.full(n_series, np.nan)
        self.open = np.zeros(n_series, dtype=bool)
        self.onset = np.full(n_series, -1, dtype=np.int64)

    def grow(self, n_series: int) -> None:
        """Append fresh series."""
        extra = n_series - self.baseline.shape[0]
        if extra > 0:
            self.baseline = np.concatenate([self.baseline, np.full(extra, np.nan)])
            self.level = np.concatenate([self.level, np.full(extra, np.nan)])
            self.open = np.concatenate([self.open, np.zeros(extra, dtype=bool)])
            self.onset = np.concatenate([self.onset, np.full(extra, -1, dtype=np.int64)])

    def state_dict(self) -> dict[str, Any]:
        """The tracker's arrays."""
        return {"baseline": self.baseline, "level": self.level, "open": self.open, "onset": self.onset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.baseline = np.array(state["baseline"], dtype=np.float64)
        self.level = np.array(state["level"], dtype=np.float64)
        self.open = np.array(state["open"], dtype=bool)
        self.onset = np.array(state["onset"], dtype=np.int64)

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
        # While healthy the reference is the level just before the change (it follows warm-up and drift);
        # during an event it stays the healthy level from before the event.
        base = np.where(was_open & ~np.isnan(self.baseline[idx]), self.baseline[idx], before[idx])
        lvl = after[idx]
        # Levels are compared as magnitudes so negative-valued generic series behave symmetrically.
        up = np.abs(lvl) > np.abs(base) * (1.0 + self.threshold)
        newly = ~was_open & up
        ended = was_open & ~up
        opened[idx[newly]] = True
        recovered[idx[ended]] = True
        self.open[idx[newly]] = True
        self.onset[idx[newly]] = index[idx[newly]]
        self.open[idx[ended]] = False
        self.onset[idx[ended]] = -1
        self.baseline[idx] = np.where(self.open[idx], base, lvl)
        self.level[idx] = lvl
        return opened, recovered

    def slowdown(self) -> FloatArray:
        """Level over baseline for open events, 1.0 elsewhere."""
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.abs(self.level) / np.abs(self.baseline)
        return np.where(self.open & np.isfinite(r), r, 1.0)


class Stream:
    """Single-series streaming form of any batch detector: ``update(x) -> Verdict``."""

    def __init__(self, detector: BatchDetector) -> None:
        if detector.n_series != 1:
            raise InputError("Stream wraps a detector built for exactly one series")
        self.detector = detector

    def update(self, x: float) -> Verdict:
        """Consume one sample (NaN = missing)."""
        return self.detector.update(np.array([x], dtype=np.float64)).verdict(0)


# --------------------------------------------------------------------------- registry
Factory = Callable[..., BatchDetector]


def _bocd_v(n_series: int, **kw: Any) -> BatchDetector:
    from failslow.verify import VerifiedBOCD
    return VerifiedBOCD(n_series, **kw)


def _bocd(n_series: int, **kw: Any) -> BatchDetector:
    from failslow.verify import PlainBOCD
    return PlainBOCD(n_series, **kw)


def _window(n_series: int, **kw: Any) -> BatchDetector:
    from failslow.window import WindowMedian
    return WindowMedian(n_series, **kw)


#: Method name -> factory ``f(n_series, **options) -> BatchDetector``. Add a method by adding a line.
METHODS: dict[str, Factory] = {"bocd-v": _bocd_v, "bocd": _bocd, "window": _window}


def make_detector(method: str, n_series: int, **options: Any) -> BatchDetector:
    """Build a registered detector for ``n_series`` series."""
    try:
        factory = METHODS[method]
    except KeyError:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None
    return factory(n_series, **options)


@dataclass(frozen=True)
class SeriesResult:
    """All change points of one series plus its fail-slow events.

    Attributes:
        change_points: Confirmed change points in order of index.
        events: ``(onset, detected_at, end)`` per slowdown event; ``end`` is the index of the change that
            closed it, or -1 if still open at the end of the series.
    """

    change_points: list[ChangePoint]
    events: list[tuple[int, int, int]]


def detect_matrix(values: NDArray[np.floating[Any]], method: str = "bocd-v",
                  **options: Any) -> list[SeriesResult]:
    """Run a method over a ``(T, S)`` array (S series of length T) and collect every series' result."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise InputError("values must be a (T,) or (T, S) array")
    det = make_detector(method, arr.shape[1], **options)
    cps: list[list[ChangePoint]] = [[] for _ in range(arr.shape[1])]
    events: list[list[list[int]]] = [[] for _ in range(arr.shape[1])]
    for row in arr:
        v = det.update(row)
        for i in np.flatnonzero(v.changed | v.opened | v.recovered):
            one = v.verdict(int(i))
            if one.change is not None:
                cps[i].append(one.change)
            if one.recovered and events[i]:
                events[i][-1][2] = one.change.index if one.change is not None else v.t
            if one.opened:
                events[i].append([one.onset, v.t, -1])
    return [SeriesResult(change_points=sorted(c, key=lambda p: p.index),
                         events=[(a, b, e) for a, b, e in ev]) for c, ev in zip(cps, events, strict=True)]


def detect_series(values: NDArray[np.floating[Any]], method: str = "bocd-v", **options: Any) -> SeriesResult:
    """Run a method over one series (NaN = missing) and return its change points and events."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    return detect_matrix(arr[:, None], method, **options)[0]
