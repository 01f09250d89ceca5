"""The registry of change-point methods, and the offline API over whole series.

What it is for: one name per method (``bocd-v``, ``bocd``, ``window``) that the CLI, the evaluation and the
service build detectors by (:func:`make_detector`); :func:`select_state`/:func:`keep_series` drop dead series
from a running detector; :func:`detect_series` runs a whole array and returns the change points and the
fail-slow events (:class:`SeriesResult`), through each method's batch form (``OFFLINE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.detect.base import BatchDetector, Change, ChangePoint
from failslow.detect.bocdv import PlainBOCD, VerifiedBOCD, plain_changes, verified_changes
from failslow.detect.events import SETTLE, EventTracker
from failslow.detect.trend import VerifyConfig
from failslow.detect.window import WindowMedian, window_changes
from failslow.errors import InputError

Factory = Callable[..., BatchDetector]


#: Method name -> factory ``f(n_series, **options) -> BatchDetector``. Add a method by adding a line.
METHODS: dict[str, Factory] = {"bocd-v": VerifiedBOCD, "bocd": PlainBOCD, "window": WindowMedian}


def make_detector(method: str, n_series: int, **options: Any) -> BatchDetector:
    """Build a registered detector for ``n_series`` series."""
    try:
        factory = METHODS[method]
    except KeyError:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None
    return factory(n_series, **options)


def select_state(state: dict[str, Any], rows: NDArray[np.integer[Any]] | list[int]) -> dict[str, Any]:
    """The state of a subset of series, for a detector of ``len(rows)`` series: drop dead series.

    Every array in a registered detector's state has one row per series (scalars are shared counters),
    so keeping ``rows`` of each array keeps exactly those series' posteriors and histories.
    """
    idx = np.asarray(rows, dtype=np.int64)
    out: dict[str, Any] = {}
    for k, v in state.items():
        a = np.asarray(v)
        if a.ndim == 0:
            out[k] = v
            continue
        if idx.size and (idx.min() < 0 or idx.max() >= a.shape[0]):
            raise InputError(f"rows out of range for {k!r} with {a.shape[0]} series")
        out[k] = a[idx].copy()
    return out


def keep_series(det: BatchDetector, method: str, rows: NDArray[np.integer[Any]] | list[int],
                **options: Any) -> BatchDetector:
    """A detector over only ``rows`` of ``det``'s series, each resuming exactly where it was."""
    new = make_detector(method, len(rows), **options)
    new.load_state_dict(select_state(det.state_dict(), rows))
    return new


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


def _offline_bocd_v(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    v = kw.get("verify") or VerifyConfig()
    return verified_changes(x, kw.get("bocd"), v), v.threshold, SETTLE


def _offline_bocd(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    return plain_changes(x, kw.get("bocd"), kw.get("verify")), 0.0, 0


def _offline_window(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    thr = float(kw.get("threshold", 0.10))
    return window_changes(x, int(kw.get("width", 10)), thr), thr, SETTLE


#: Batch forms over one whole series (same decisions as the streaming detectors, less overhead): the changes,
#: and the threshold and settle time of the method's :class:`EventTracker`.
OFFLINE: dict[str, Callable[..., tuple[list[Change], float, int]]] = {
    "bocd-v": _offline_bocd_v, "bocd": _offline_bocd, "window": _offline_window}


def detect_series(values: NDArray[np.floating[Any]], method: str = "bocd-v", **options: Any) -> SeriesResult:
    """Run a method over one series (NaN = missing) and return its change points and events.

    Uses the method's batch form when it has one; it makes the same decisions as feeding the streaming
    detector sample by sample (tests check this).
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method not in OFFLINE:
        return detect_matrix(arr[:, None], method, **options)[0]
    changes, threshold, settle = OFFLINE[method](arr, **options)
    tracker = EventTracker(1, threshold, settle)
    cps: list[ChangePoint] = []
    events: list[list[int]] = []
    one = np.ones(1, dtype=bool)
    for t, c, p, lb, la in changes:
        cps.append(ChangePoint(index=c, probability=p, level_before=lb, level_after=la,
                               ratio=la / lb if lb != 0 else math.nan, detected_at=t))
        opened, recovered = tracker.observe(one, np.array([c], dtype=np.int64), np.array([lb]), np.array([la]))
        if recovered[0] and events:
            events[-1][2] = c
        if opened[0]:
            events.append([c, t, -1])
    return SeriesResult(change_points=sorted(cps, key=lambda q: q.index),
                        events=[(a, b, e) for a, b, e in events])
