"""Where iterations begin and where they are marked.

A period says how many calls make an iteration, not which call begins one: at a stream's origin the first
iteration begins where the calls start repeating (`periodic_start`), after a pattern change on the grid of
the old boundaries (`phase_anchor`). An iteration's duration is then measured between marks on one side
of each boundary (`mark_at_end`, `iteration_marks`), or between the mean start times of its calls
(`centroids`) when call end times are unknown.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from failslow.period.numeric import FloatArray, IntArray

#: Iterations are marked at the end of their last call (instead of the start of their first) when
#: the idle time before the first call is more than this fraction of the iteration.
MARK_END_IDLE: Final = 0.5


def centroids(t: FloatArray, starts: IntArray, period: int) -> FloatArray:
    """Mean start time of the calls of each iteration (iterations begin at ``starts``).

    Differences of centroids are iteration durations in which every call of the iteration votes, not
    only the boundary call: the jitter of one call's timing is divided by the period, and over any
    run of iterations the durations still add up exactly (they telescope).
    """
    if len(starts) == 0:
        return np.empty(0)
    cs = np.concatenate(([0.0], np.cumsum(t - t[0])))
    return np.asarray((cs[starts + period] - cs[starts]) / period + t[0], dtype=np.float64)


def periodic_start(symbols: IntArray | None, period: int) -> int:
    """Index of the first call from which ``period`` calls in a row repeat one period later.

    At the origin of a stream this is where the first iteration begins: the set-up calls before it (a
    barrier, parameter broadcasts) do not repeat. Calls that all look alike give 0.
    """
    if symbols is None or len(symbols) < 2 * period + 1:
        return 0
    mis = (symbols[:-period] != symbols[period:]).astype(np.int64)
    cs = np.concatenate(([0], np.cumsum(mis)))
    clean = np.flatnonzero(cs[period:] - cs[:-period] == 0)  # windows [i, i + period) without a mismatch
    return int(clean[0]) if len(clean) else 0


def phase_anchor(t: FloatArray, base: int, seg: int, p: int, boundaries: IntArray, sym: IntArray | None, *,
                 from_origin: bool, grid: tuple[int, int] | None, resume: int | None,
                 last_b: int | None) -> int:
    """Absolute index of a call that begins an iteration of period ``p`` in the stretch from call ``seg``.

    Args:
        t: The buffered call start times; ``t[0]`` is call ``base`` (absolute index).
        base: Absolute index of ``t[0]``.
        seg: Absolute index of the stretch's first call.
        p: The period.
        boundaries: The estimate's boundaries, relative to ``seg``.
        sym: The stretch's symbols (``None``: calls alike).
        from_origin: The stretch starts at the stream's origin (its first call is the process's first).
        grid: ``(boundary, period)`` of the grid before a pattern change, or ``None``.
        resume: First unreported boundary before the restart, or ``None``.
        last_b: Last boundary already emitted, or ``None``.
    """
    lo = seg
    if from_origin:
        return lo + periodic_start(sym, p)
    if grid is not None:
        # The new iterations begin on the old grid: the first old boundary at or after the point from
        # which the new pattern repeats.
        gb, gp = grid
        i0 = lo + periodic_start(sym, p)
        first = gb + -(-(i0 - gb) // gp) * gp
        cands = np.arange(first, i0 + p, gp, dtype=np.int64)
        if len(cands) <= 1:
            return first
        # Several old boundaries fall inside one new iteration (the symbols cannot tell which one
        # began it, e.g. twice the micro-batches of alike Send/Recv): the new iteration begins at
        # the one that kept the optimizer's gap before it, the longest median gap of them.
        g = np.concatenate(([0.0], np.maximum(np.diff(t[lo - base:]), 0.0)))
        med = [float(np.median(g[c - lo::p])) if len(g[c - lo::p]) else 0.0 for c in cands]
        j = int(np.argmax(med))
        a = int(cands[j])
        # The change may have been noticed one old block late (the first half of a longer new
        # iteration looked right): step back while the unreported call there has that gap too.
        floor = max(base + 1, resume if resume is not None else lo, gb - gp)
        while a - p >= floor and t[a - p - base] - t[a - p - 1 - base] >= 0.5 * med[j]:
            a -= p
        return a
    bounds = lo + boundaries
    # Emission resumes at the first new boundary not before what was already reported: the
    # iteration that straddles a pattern change mixes two schedules and is not reported.
    if last_b is not None:
        bounds = bounds[bounds >= last_b]
    return int(bounds[0]) if len(bounds) else lo + int(boundaries[-1])


def mark_at_end(t: FloatArray, te: FloatArray, base: int, seg: int, anchor: int, p: int | None) -> bool:
    """Whether iterations are marked by the end of their last call (else the start of their first).

    The trainer's iteration ends with its optimizer step, between the last call of one iteration and
    the first call of the next. The marker on the side with less other work between it and that
    step moves least with the load: the start of the first call when it follows the step closely (a
    pipeline stage receives its first activation right away), the end of the last call when the
    whole forward and backward pass lies before the first call (data parallel only: one gradient
    all-reduce per iteration).

    Args:
        t, te: The buffered call start and end times (NaN where unknown); index 0 is call ``base``.
        base: Absolute index of the first buffered call.
        seg: Absolute index of the stretch's first call.
        anchor: Absolute index of a boundary of period ``p``.
        p: The period (``None``: none yet).
    """
    if p is None:
        return True
    first = np.arange(anchor, base + len(t) - p, p, dtype=np.int64)
    first = first[first - 1 >= max(seg, base)]
    if len(first) == 0:
        return True
    i = first - base
    idle = t[i] - te[i - 1]
    span = t[i + p] - t[i]
    ok = np.isfinite(idle) & (span > 0)
    if not ok.any():
        return True
    return bool(np.median(np.maximum(idle[ok], 0.0) / span[ok]) > MARK_END_IDLE)


def iteration_marks(t: FloatArray, te: FloatArray, base: int, b: IntArray, p: int,
                    mark_end: bool) -> tuple[IntArray, FloatArray | None]:
    """The boundaries ``b`` (absolute) that can be marked, and their marks (``None`` with fewer than two).

    Iteration ``k`` runs from boundary ``b[k]`` to ``b[k+1]``, marked at the end of the last call before
    the boundary (``mark_end``), else at the start of the boundary's call; without call end times at the
    mean start time of the iteration's calls (`centroids`), for whole iterations only.
    """
    end = base + len(t)
    ii = b - base
    if mark_end and len(b) and ii[0] < 1:
        b, ii = b[1:], ii[1:]  # the first boundary of the buffer has no previous call to mark it
    c: FloatArray | None = None
    if len(b) >= 2:
        if mark_end and ii[0] >= 1 and np.isfinite(te[ii - 1]).all():
            c = te[ii - 1]  # end of the last call of the previous iteration
        elif np.isfinite(te[ii[0]:ii[-1]]).all():
            c = t[ii]  # start of the first call of the iteration
        else:
            b = b[b + p <= end]  # no call end times: every call of an iteration votes
            ii = b - base
            if len(b) >= 2:
                c = centroids(t, ii, p)
    return b, c
