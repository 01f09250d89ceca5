"""The period of one stationary stretch of calls: `estimate_period`, combining the two views of the stream.

* **Symbols** (`failslow.period.symbols`): each call's (op kind, communicator, bytes) is encoded as a
  category; the lags at which the symbol sequence repeats rule out every lag that is not a multiple of
  the period, but cannot tell the period from a shorter repeating unit (a micro-batch of identical calls)
  and say nothing when all calls look alike (a pipeline stage doing only Send/Recv).
* **Gaps** (`failslow.period.gaps`, `failslow.period.folds`): the idle time before each call, on a log
  scale, is periodic with the iteration too. Autocorrelation of the gap signal shortlists lags; a periodic
  template ("fold") fitted at each shortlisted lag and cross-validation between a lag and its divisors
  then pick the *smallest* lag that explains the gaps as well as any multiple of it.

Whole iterations split by gaps far longer than any other (`failslow.period.gaps.split_by_gaps`) decide
before the autocorrelation can. The estimate's confidence (`failslow.period.confidence`) says how much of
the structure the period explains.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.boundaries import centroids
from failslow.period.confidence import CONFIDENCE_MIN, find_cycle, regularity
from failslow.period.folds import choose_by_gaps
from failslow.period.gaps import SPLIT_RATIO, SPLIT_RATIO_DECISIVE, gap_signal, split_by_gaps
from failslow.period.numeric import FloatArray, IntArray
from failslow.period.symbols import (
    MAX_SYMBOLS,
    SYMBOL_PERIODIC,
    SYMBOL_SCHEDULE,
    SYMBOL_SLACK,
    symbol_mismatch,
    symbols_repeat,
)

#: Repeats a period needs when only the gaps (no distinguishing symbols) can reveal it.
GAP_MIN_REPEATS: Final = 8
#: A lone gap this many times the iteration time, far above every other gap, in a stretch of at most
#: DOUBT_MAX_CALLS calls with fewer calls after it than before, may be the first gap between iterations
#: the period is a fraction of: the period is not stated until more calls tell.
DOUBT_FACTOR: Final = 10.0
DOUBT_MAX_CALLS: Final = 2048


@dataclass(frozen=True)
class PeriodEstimate:
    """The period found in one stationary stretch of calls.

    Attributes:
        period: Calls per iteration.
        phase: Index (``0 <= phase < period``) of the first call of an iteration within the stretch:
            the call preceded by the longest median gap.
        confidence: In [0, 1]; how much of the gap structure (and symbol sequence) the period explains.
        boundaries: Indices of the calls that begin iterations (``phase, phase + period, ...``).
        boundary_times: Start times of those calls, seconds.
        iteration_s: Durations between consecutive complete iterations, measured between the mean
            start times of their calls (see `failslow.period.boundaries.centroids`).
        method: ``"gaps"`` when the gap split decided (`split_by_gaps`), else ``"acf"``.
    """

    period: int
    phase: int
    confidence: float
    boundaries: IntArray
    boundary_times: FloatArray
    iteration_s: FloatArray
    method: str = "acf"


def estimate_period(
    t_start: npt.ArrayLike,
    symbols: npt.ArrayLike | None = None,
    *,
    min_repeats: int = 3,
    max_period: int | None = None,
) -> PeriodEstimate | None:
    """Find the iteration period of one stationary stretch of calls.

    Args:
        t_start: Start (or enqueue) time of each call in seconds, in call order.
        symbols: Optional per-call category (see `encode_symbols`); ``None`` means calls are alike.
        min_repeats: The stretch must hold at least this many iterations for a period to count.
        max_period: Largest period considered (default ``len(t_start) // min_repeats``).

    Returns:
        The estimate, or ``None`` when the stretch is too short or shows no periodic structure.

    Raises:
        InputError: mismatched lengths, non-finite times, or ``min_repeats < 2``.
    """
    t = np.asarray(t_start, dtype=np.float64)
    if t.ndim != 1 or not np.isfinite(t).all():
        raise InputError("estimate_period: t_start must be a 1-D array of finite times")
    if min_repeats < 2:
        raise InputError("estimate_period: min_repeats must be at least 2")
    s = None if symbols is None else np.asarray(symbols, dtype=np.int64)
    if s is not None:
        if s.shape != t.shape:
            raise InputError("estimate_period: symbols and t_start differ in length")
        if s.min(initial=0) < 0:
            raise InputError("estimate_period: symbols must be non-negative ids (see encode_symbols)")
    split = split_by_gaps(t, s)
    by_gaps = None
    if split is not None and split.fold == 1 and split.exact and len(split.counts) >= 2 \
            and (max_period is None or split.period <= max_period) and symbols_repeat(s, split.period):
        by_gaps = replace(_boundaries(t, split.period, confidence=split.confidence,
                                      phase=int(split.starts[-1]) % split.period, check=False), method="gaps")
        if split.ratio >= SPLIT_RATIO_DECISIVE:
            return by_gaps  # gaps between iterations an order of magnitude above all others
        if len(split.counts) >= GAP_MIN_REPEATS:
            by_gaps = None  # enough repeats for the autocorrelation and its block test to decide
    est = _estimate_acf(t, s, symbols is None, min_repeats, max_period)
    if est is None or est.confidence < CONFIDENCE_MIN:
        # Whole iterations of equal counts between gaps far longer than any other: decisive from two
        # iterations on, where the autocorrelation needs more repeats or finds no confident answer.
        return by_gaps if by_gaps is not None else est
    if split is not None and split.period != est.period and len(split.counts) >= 2:
        # The gap structure splits the calls into iterations of another length (varying counts, or parts
        # of an iteration folded): the autocorrelation's answer is not to be stated with confidence.
        est = replace(est, confidence=0.5 * CONFIDENCE_MIN * est.confidence)
    return est


def _estimate_acf(t: FloatArray, s: IntArray | None, no_symbols: bool, min_repeats: int,
                  max_period: int | None) -> PeriodEstimate | None:
    """The autocorrelation's estimate (symbols, then gaps; see the module docstring), or ``None``."""
    n = len(t)
    maxlag = n // min_repeats if max_period is None else min(int(max_period), n // min_repeats)
    if maxlag < 1:
        return None
    allowed = np.ones(maxlag + 1, dtype=bool)
    allowed[0] = False
    sym_conf = 1.0
    if s is not None and (s != s[0]).any():
        mis = symbol_mismatch(np.minimum(s, MAX_SYMBOLS - 1), maxlag)
        best_mis = float(mis[1:].min())
        if best_mis <= SYMBOL_PERIODIC:
            allowed[1:] = mis[1:] <= best_mis + SYMBOL_SLACK
            sym_conf = 1.0 - best_mis
        else:
            # Calls differ but no lag repeats them: the period is longer than this stretch can show
            # (a young stream). Falling back to the gaps here would return a lag the symbols already
            # contradict (e.g. 1 call per iteration), so there is no estimate yet.
            return None
    z = gap_signal(t)
    if z is not None and allowed[1:].all():
        # Timing alone: a chance fit of a long template to jitter is likely with few repeats, so a
        # period must repeat GAP_MIN_REPEATS times before the gaps alone may claim it.
        maxlag = max(1, min(maxlag, n // GAP_MIN_REPEATS))
        allowed = allowed[: maxlag + 1]
    elif z is not None and (sym_period := int(np.flatnonzero(allowed)[0])) >= SYMBOL_SCHEDULE:
        # The symbols show a schedule (not just an alternating Send/Recv pair) and allow only multiples
        # of its period. Which multiple is the iteration is again timing alone, with the same risk: a
        # long template fitted to the jitter of a loaded machine (a stage of alike micro-batches,
        # its first Recv told apart by `PeriodTracker.together`, read as 24 calls per iteration
        # instead of 12 on 4 repeats). So a multiple needs GAP_MIN_REPEATS repeats too. (For a 1- or
        # 2-call symbol period the iteration is usually a multiple, which only timing can find.)
        allowed[max(sym_period, n // GAP_MIN_REPEATS) + 1:] = False
    if z is None:
        period, gap_conf = int(np.flatnonzero(allowed)[0]), 1.0
    else:
        period, gap_conf = choose_by_gaps(z, allowed, maxlag)
        if sym_conf == 1.0 and no_symbols and gap_conf < 0.05 and period > 1:
            # Gaps alone and no structure found: the stream is aperiodic noise.
            return None
    est = _boundaries(t, period, confidence=float(sym_conf * gap_conf))
    if est.confidence >= CONFIDENCE_MIN and _lone_long_gap(t, est.iteration_s):
        est = replace(est, confidence=0.5 * CONFIDENCE_MIN * est.confidence)
    return est


def _lone_long_gap(t: FloatArray, iteration_s: FloatArray) -> bool:
    """Whether a young stretch holds one gap far longer than its iterations and than every other gap.

    It may be the first gap between real iterations (a few hundred alike calls each) that the period found
    divides; the second one, an iteration later, makes the gap split decisive. A stall of a long-running
    stretch is not doubted (see `DOUBT_FACTOR`).
    """
    n = len(t)
    if n < 4 or len(iteration_s) == 0 or n > DOUBT_MAX_CALLS:
        return False
    g = np.maximum(np.diff(t), 0.0)
    i = int(np.argmax(g))
    rest = float(np.max(np.delete(g, i)))
    before, after = i + 1, n - i - 1
    return bool(g[i] >= SPLIT_RATIO * rest and g[i] >= DOUBT_FACTOR * float(np.median(iteration_s))
                and after < before)


def _boundaries(t: FloatArray, period: int, *, confidence: float, phase: int | None = None,
                check: bool = True) -> PeriodEstimate:
    """The estimate for ``period``: phase (given, else after the longest median gap), boundaries, times.

    With ``check``, ``confidence`` (the structure the period explains) is raised to the regularity of the
    iteration times when that is higher (one call per iteration explains no gap structure), scaled down
    when fewer than four whole iterations were seen, and cut to a fifth when the iteration times
    repeat in a cycle: the period is then a fraction of the true one.
    """
    gaps = np.concatenate(([0.0], np.maximum(np.diff(t), 0.0)))
    phase_idx = np.arange(len(t)) % period
    # Median gap per phase (vectorised: sort by phase, then by gap within phase).
    order = np.lexsort((gaps, phase_idx))
    counts = np.bincount(phase_idx, minlength=period)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    med = gaps[order][starts + (counts - 1) // 2]
    if len(t) > period:  # the first call's zero gap must not decide phase 0
        first = gaps[period::period] if period < len(t) else gaps[:0]
        med[0] = float(np.median(first)) if len(first) else med[0]
    if phase is None:
        phase = int(np.argmax(med))
    b = np.arange(phase, len(t), period, dtype=np.int64)
    complete = b[b + period <= len(t)]
    its = np.diff(centroids(t, complete, period))
    if check:
        confidence = max(confidence, regularity(its)) * min(1.0, len(its) / 4)
        if confidence >= CONFIDENCE_MIN and len(its) >= 4 and find_cycle(np.log(np.maximum(its, 1e-12))) > 1:
            confidence *= 0.2
    return PeriodEstimate(period=period, phase=phase, confidence=min(1.0, max(0.0, confidence)),
                          boundaries=b, boundary_times=t[b], iteration_s=its)
