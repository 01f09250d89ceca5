"""The gap template of a tracked period: the per-phase gap profile of its iterations, and which new
iterations do not look like it.

A stream whose calls all look alike can only show a new schedule (e.g. more micro-batches) through its
gaps: `PeriodTracker` checks every new iteration against the template fitted on the current stretch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.period.numeric import FloatArray, IntArray

#: An iteration whose gap profile correlates with the template this much less than usual is "different".
CORR_DROP: Final = 0.3
#: Iterations a template needs before its zero/non-zero gap structure is used to flag new schedules.
ZERO_MIN_ITERATIONS: Final = 8


@dataclass
class GapTemplate:
    """Per-phase gap profile of one period's iterations, on the log gap scale of its stretch.

    The buffer the tracker keeps is passed to every method: ``t`` holds call start times, ``t[0]`` being
    call ``base`` (absolute index); ``starts`` are absolute indices of iterations' first calls.

    Attributes:
        profile: Median scaled log gap per position of an iteration, or ``None`` (no template).
        scale: Gap scale of the stretch the template was fitted on (its median gap).
        corr_min: Correlation with the profile below which an iteration does not look like it.
        never_zero: Positions whose gap never was 0 (``None`` until `ZERO_MIN_ITERATIONS` iterations).
        always_zero: Positions whose gap always was 0 (issued together with the call before).
    """

    profile: FloatArray | None = None
    scale: float = 1.0
    corr_min: float = -1.0
    never_zero: npt.NDArray[np.bool_] | None = None
    always_zero: npt.NDArray[np.bool_] | None = None

    def log_gaps(self, t: FloatArray, base: int, start: int, stop: int) -> FloatArray:
        """Scaled log gap before each call in absolute ``[start, stop)`` (first call of buffer: 0)."""
        i = np.arange(start, stop) - base
        prev = np.maximum(i - 1, 0)
        g = np.maximum(t[i] - t[prev], 0.0)
        return np.asarray(np.log1p(g / self.scale), dtype=np.float64)

    def corr(self, t: FloatArray, base: int, starts: IntArray, p: int | None) -> FloatArray:
        """Correlation of each iteration's gap profile (iterations of ``p`` calls starting at ``starts``)
        with the template."""
        if p is None or self.profile is None or len(self.profile) != p or len(starts) == 0:
            return np.ones(len(starts))
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        lo = int(idx.min())
        x = self.log_gaps(t, base, lo, int(idx.max()) + 1)[idx - lo].reshape(len(starts), p)
        xc = x - x.mean(axis=1, keepdims=True)
        tc = self.profile - self.profile.mean()
        den = np.sqrt((xc * xc).sum(axis=1) * float(tc @ tc))
        return np.where(den > 0, (xc @ tc) / np.maximum(den, 1e-300), 1.0)

    def fit(self, t: FloatArray, base: int, seg: int, anchor: int, p: int | None,
            upto: int | None = None) -> None:
        """Fit the template of period ``p`` on the stretch from call ``seg`` (iterations on the grid of
        ``anchor``, ending at or before ``upto``), and how well its own iterations match it.

        Later iterations are checked against it: a stream whose calls all look alike can only show a
        new schedule (e.g. more micro-batches) through its gaps.
        """
        self.profile = self.never_zero = self.always_zero = None
        if p is None or p < 3:
            return
        end = base + len(t)
        lo = max(seg, base + 1)
        gaps = np.maximum(np.diff(t[lo - base - 1:]), 0.0)
        self.scale = max(float(np.median(gaps)), 1e-9) if len(gaps) else 1.0
        first = lo + ((anchor - lo) % p)
        stop = end - p + 1 if upto is None else min(end - p + 1, upto)
        starts = np.arange(first, stop, p, dtype=np.int64)
        if len(starts) < 2:
            return
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        x = self.log_gaps(t, base, first, int(idx.max()) + 1)[idx - first].reshape(len(starts), p)
        tmpl = np.median(x, axis=0)
        if float(np.ptp(tmpl)) <= 0:
            return
        self.profile = tmpl
        if len(starts) >= ZERO_MIN_ITERATIONS:
            self.never_zero, self.always_zero = (x > 0).all(axis=0), (x == 0).all(axis=0)
        own = self.corr(t, base, starts, p)
        med = float(np.median(own))
        mad = float(np.median(np.abs(own - med)))
        self.corr_min = med - max(CORR_DROP, 6.0 * mad)

    def bad(self, t: FloatArray, base: int, starts: IntArray, p: int | None) -> npt.NDArray[np.bool_]:
        """Which iterations of ``p`` calls starting at ``starts`` do not look like the template.

        Either the whole gap profile correlates poorly with the template, or the structure of the
        calls changed: a position that was never issued together with the call before it now is (the
        optimizer's gap before an iteration's first Recv is gone: this is the second half of a longer
        iteration of alike micro-batches), or calls always issued together (a batched Send/Recv pair)
        are apart. Jitter, however large on a loaded machine, changes neither.
        """
        bad = self.corr(t, base, starts, p) < self.corr_min
        if p is None or self.never_zero is None or self.always_zero is None or len(self.never_zero) != p \
                or len(starts) == 0:
            return np.asarray(bad, dtype=bool)
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        lo = int(idx.min())
        x = self.log_gaps(t, base, lo, int(idx.max()) + 1)[idx - lo].reshape(len(starts), p)
        out = bad | ((x == 0) & self.never_zero).any(axis=1) | ((x > 0) & self.always_zero).any(axis=1)
        return np.asarray(out, dtype=bool)
