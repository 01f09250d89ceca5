"""The detection protocol every change-point method implements, the verdicts it returns, and the registry.

What it is for: one shape for all detectors so the CLI, the evaluation and the service can swap them.
A method is a *batch* detector over ``n_series`` series updated in lock step (``update(x) -> BatchVerdict``
with one sample per series); :class:`Stream` turns any of them into the single-series streaming form
``update(x) -> Verdict``. :func:`detect_series` runs a whole array and returns the change points.

On top of the raw change points, :class:`EventTracker` keeps the fail-slow state of each series: a
confirmed change that lifts the level at least ``threshold`` above the healthy baseline opens an event
(the first slow sample is its onset); one that brings the level back closes it (a recovery). Speed-ups
while healthy (warm-up ending) move the baseline, but a rise back to the level the series ran at before a
speed-up is no slowdown until the faster level has lasted ``SETTLE`` samples (see :class:`EventTracker`).
"""

from __future__ import annotations

import itertools
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

    ``index`` is -1 and the float fields NaN where ``changed`` is False. ``baseline`` is the healthy level
    each open event is measured against (``slowdown`` = level / baseline; NaN where none is open), or None
    from a detector that does not say.
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
    baseline: FloatArray | None = None

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
        rise = peak - np.abs(base)
        undone = (rise > 0) & (np.abs(lvl) - np.abs(base) <= (1.0 - RECOVER_SHARE) * rise)
        return up, ~up | undone

    def would_end(self, idx: IntArray, after: FloatArray) -> BoolArray:
        """Whether a confirmed change of series `idx` to the levels `after` would end their open events
        (False where none is open): what :meth:`observe` would decide, without changing anything."""
        was_open = self.open[idx] & ~np.isnan(self.baseline[idx])
        peak = np.fmax(np.abs(self.peak[idx]), np.abs(self.level[idx]))
        _, back = self._judge(self.baseline[idx], peak, np.asarray(after, dtype=np.float64))
        out: BoolArray = was_open & back
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


Change = tuple[int, int, float, float, float]  # (detected_at, index, probability, level_before, level_after)


def _offline_bocd_v(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    from failslow.verify import VerifyConfig, verified_changes
    v = kw.get("verify") or VerifyConfig()
    return verified_changes(x, kw.get("bocd"), v), v.threshold, SETTLE


def _offline_bocd(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    from failslow.verify import plain_changes
    return plain_changes(x, kw.get("bocd"), kw.get("verify")), 0.0, 0


def _offline_window(x: NDArray[np.float64], **kw: Any) -> tuple[list[Change], float, int]:
    from failslow.window import window_changes
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


# --------------------------------------------------------------------------- CSV input and JSON output
def parse_series_csv(text: str, column: str | None = None, all_columns: bool = False) -> dict[str, FloatArray]:
    """Numeric series from CSV text with a header; empty cells (and ``nan``) are missing samples.

    Picks ``column`` if given, else ``value`` if present, else the only numeric column; with
    ``all_columns`` every numeric column. Raises :class:`InputError` with the reason otherwise.
    """
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise InputError("empty input: expected a CSV header and at least one row")
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header):
        raise InputError(f"duplicate column names in header: {header}")
    body = rows[1:]
    if not body:
        raise InputError("no data rows after the header")
    for k, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise InputError(f"line {k}: {len(r)} fields, header has {len(header)}")

    def numeric(j: int) -> FloatArray | str:
        out = np.empty(len(body))
        for k, r in enumerate(body):
            cell = r[j].strip()
            if not cell:
                out[k] = np.nan
                continue
            try:
                val = float(cell)
            except ValueError:
                return f"line {k + 2}: {cell!r} in column {header[j]!r} is not a number"
            if math.isinf(val):
                return f"line {k + 2}: infinite value in column {header[j]!r}"
            out[k] = val
        if np.isnan(out).all():
            return f"column {header[j]!r} has no values"
        return out

    if column is not None or (not all_columns and "value" in header):
        name = column if column is not None else "value"
        if name not in header:
            raise InputError(f"no column {name!r}; the header has {', '.join(header)}")
        got = numeric(header.index(name))
        if isinstance(got, str):
            raise InputError(got)
        return {name: got}
    found: dict[str, FloatArray] = {}
    reasons: list[str] = []
    for j, name in enumerate(header):
        got = numeric(j)
        if isinstance(got, str):
            reasons.append(got)
        else:
            found[name] = got
    if not found:
        raise InputError("no numeric column: " + "; ".join(reasons))
    if all_columns:
        return found
    if len(found) > 1:
        raise InputError(f"several numeric columns ({', '.join(found)}) and none named 'value': "
                         "pick one with --column or use --all-columns")
    return found


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def result_json(values: FloatArray, result: SeriesResult, method: str) -> dict[str, Any]:
    """The `failslow detect` JSON for one series: means are over whole segments between change points."""
    bounds = [0] + [c.index for c in result.change_points] + [values.shape[0]]
    means = []
    for a, b in itertools.pairwise(bounds):
        seg = values[a:b]
        seg = seg[~np.isnan(seg)]
        means.append(float(seg.mean()) if seg.size else math.nan)
    cps = []
    for k, c in enumerate(result.change_points):
        m0, m1 = means[k], means[k + 1]
        cps.append({"index": c.index, "probability": _finite(round(c.probability, 6)),
                    "mean_before": _finite(m0), "mean_after": _finite(m1),
                    "ratio": _finite(m1 / m0) if m0 != 0 else None})
    return {"method": method, "n": int(values.shape[0]), "change_points": cps}
