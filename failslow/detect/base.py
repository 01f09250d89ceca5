"""The detection protocol every change-point method implements, and the verdicts it returns.

What it is for: one shape for all detectors so the CLI, the evaluation and the service can swap them.
A method is a *batch* detector over ``n_series`` series updated in lock step (``update(x) -> BatchVerdict``
with one sample per series); :class:`Stream` turns any of them into the single-series streaming form
``update(x) -> Verdict``. The methods are registered in :mod:`failslow.detect.registry`; the fail-slow
state each keeps on top of its change points is :class:`failslow.detect.events.EventTracker`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

Change = tuple[int, int, float, float, float]
"""A change as the batch forms of one series report it: (detected_at, index, probability, level_before,
level_after)."""


def no_changes(n: int) -> tuple[BoolArray, IntArray, FloatArray, FloatArray, FloatArray]:
    """One step's verdict arrays with nothing changed: ``changed``, ``index``, ``probability``, ``level_before``,
    ``level_after`` for `n` series (a detector fills in the rows that changed)."""
    return (np.zeros(n, dtype=bool), np.full(n, -1, dtype=np.int64), np.full(n, np.nan), np.full(n, np.nan),
            np.full(n, np.nan))


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

    @property
    def t(self) -> int:
        """Index of the last sample consumed (-1 before the first)."""
        ...

    def seek(self, t: int) -> None:
        """Set the clock of a detector that has consumed nothing yet: its next sample gets index ``t + 1``
        (a service that starts detecting after polls it did not feed keeps its sample indices)."""
        ...

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


class Stream:
    """Single-series streaming form of any batch detector: ``update(x) -> Verdict``."""

    def __init__(self, detector: BatchDetector) -> None:
        if detector.n_series != 1:
            raise InputError("Stream wraps a detector built for exactly one series")
        self.detector = detector

    def update(self, x: float) -> Verdict:
        """Consume one sample (NaN = missing)."""
        return self.detector.update(np.array([x], dtype=np.float64)).verdict(0)

