"""Iteration period inference from a process's stream of communication calls (framework-agnostic).

Training is periodic: every iteration issues the same sequence of collectives and point-to-point calls,
separated by the same compute. Knowing only the call stream of one rank (what the shim or the torch
hook records) we recover *how many calls make one iteration*, where iterations begin, and how long
each one took — without knowing the framework, the model or the schedule.

Two views of the stream are combined:

* **Symbols**: each call's (op kind, communicator, bytes) is encoded as a category. If the sequence
  is P-periodic the symbol at ``i`` equals the symbol at ``i + P``; the mismatch rate at every lag
  comes from FFT autocorrelations of the symbol indicators. This rules out every lag that is not a
  multiple of the period, but cannot tell the period from a shorter repeating unit (a micro-batch of
  identical calls) and says nothing when all calls look alike (a pipeline stage doing only Send/Recv).
* **Gaps** (time-domain periodicity): the idle time before each call, on a log scale, is periodic
  with the iteration too; the optimizer step, data loading and the forward pass leave a long gap once
  per iteration that micro-batch repetitions do not have. Autocorrelation of the gap signal shortlists
  lags; a periodic template ("fold") fitted at each shortlisted lag and cross-validation between a
  lag and its divisors then pick the *smallest* lag that explains the gaps as well as any multiple of it.

`estimate_period` is the batch form for one stationary stretch of calls. `PeriodTracker` is the
streaming form (``update(batch) -> PeriodVerdict``) with a bounded buffer: it emits each completed
iteration once, re-estimates periodically, and restarts estimation when the call pattern changes
(e.g. the micro-batch count changes) or when records were lost. `infer_iterations` runs the tracker
over a whole recorded sequence.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy.special import fdtrc

from failslow.errors import InputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Symbols beyond this many distinct ones are merged into one "other" symbol (keeps FFT work bounded).
MAX_SYMBOLS: Final = 64
#: Symbols are periodic at a lag when at most this fraction of calls differ from the call one lag later.
SYMBOL_PERIODIC: Final = 0.1
#: A lag counts as symbol-periodic when its mismatch rate is within this of the best lag's.
SYMBOL_SLACK: Final = 0.02
#: A divisor of the best lag replaces it when its cross-validated gap residual is at most this much larger.
REL_RSS_SLACK: Final = 0.05
#: ... or larger by at most this fraction of the gap signal's total variance.
ABS_RSS_SLACK: Final = 0.005
#: An iteration whose gap profile correlates with the template this much less than usual is "different".
CORR_DROP: Final = 0.3
#: Robust block test (see `_blocks_differ`): significance in standard errors, minimum difference in
#: units of the gap signal's standard deviation, and iterations needed to run it.
BLOCK_Z: Final = 4.5
BLOCK_MIN: Final = 0.05
BLOCK_MIN_REPEATS: Final = 8
BLOCK_MAD_FLOOR: Final = 0.1
#: Repeats a period needs when only the gaps (no distinguishing symbols) can reveal it.
GAP_MIN_REPEATS: Final = 8
#: A symbol period of at least this many calls is a schedule: a multiple of it needs GAP_MIN_REPEATS.
SYMBOL_SCHEDULE: Final = 3
#: Lags shortlisted from the gap autocorrelation for the fold test.
SHORTLIST: Final = 16
#: A tracker adopts a period when its stretch holds this many repeats of it and an estimate on a
#: shorter stretch (the previous one, or the first two thirds) agrees (lock-in hysteresis).
LOCK_REPEATS: Final = 16
#: ... and, for periods of several calls, at least this many calls (a period of 8 identical-looking
#: Send/Recv pairs shows as 2 until the block test can look at 4 times that).
LOCK_MIN_CALLS: Final = 96
#: Repeats of a short multiple of a candidate period needed before its blocks may veto the candidate.
MULTIPLE_REPEATS: Final = 12
#: Iterations a template needs before its zero/non-zero gap structure is used to flag new schedules.
ZERO_MIN_ITERATIONS: Final = 8
#: Iterations are marked at the end of their last call (instead of the start of their first) when
#: the idle time before the first call is more than this fraction of the iteration.
MARK_END_IDLE: Final = 0.5
#: Confidence below which a period is not stated: `failslow period` exits 3 and the exporter shows no
#: iteration time for the rank.
CONFIDENCE_MIN: Final = 0.5
#: Gap split: every gap between iterations must be at least this many times every gap inside one ...
SPLIT_RATIO: Final = 3.0
#: ... or this many times, when the symbols show a schedule of exactly the split's calls per iteration, or
#: when iterations have at least `SPLIT_MANY_ALIKE` calls each (many equal buckets: not a micro-batch).
SPLIT_RATIO_SCHEDULE: Final = 2.0
SPLIT_MANY_ALIKE: Final = 16
#: With GAP_MIN_REPEATS iterations or more, `estimate_period` takes the split's answer only at this ratio.
SPLIT_RATIO_DECISIVE: Final = 10.0
#: Gaps below this (seconds) count as this much in the split ratio (calls issued together have gap 0).
SPLIT_FLOOR_S: Final = 1e-6
#: Gap split: calls per iteration may vary by this fraction of the median (rounded down).
SPLIT_COUNT_TOL: Final = 0.07
#: Candidate splits looked at, coarsest first.
SPLIT_CANDIDATES: Final = 24
#: Longest cycle looked for in a series of iteration times (or of the gaps that split them).
MAX_CYCLE: Final = 8
#: A cycle counts when the one-way analysis of variance by phase has a p-value below this.
CYCLE_P: Final = 1e-4
#: Iteration times with a robust coefficient of variation (MAD / median) of this or more are irregular.
IRREGULAR_CV: Final = 0.5
#: ... and so are they when iterations longer than OUTLIER_FACTOR times the median hold OUTLIER_SHARE of the time.
OUTLIER_FACTOR: Final = 3.0
OUTLIER_SHARE: Final = 0.25
#: Confidence of an answer folded from a tracker period whose iteration times cycle (three whole cycles).
FOLD_CONFIDENCE: Final = 0.6
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
            start times of their calls (see `_centroids`).
        method: ``"gaps"`` when the gap split decided (`split_by_gaps`), else ``"acf"``.
    """

    period: int
    phase: int
    confidence: float
    boundaries: IntArray
    boundary_times: FloatArray
    iteration_s: FloatArray
    method: str = "acf"


def encode_symbols(*features: npt.ArrayLike) -> IntArray:
    """Encode per-call features (op, communicator, bytes, ...) as one small integer symbol per call.

    Args:
        *features: Equal-length 1-D arrays; any dtype ``numpy.unique`` can sort (ints, strings).

    Returns:
        Symbol ids in ``0 .. MAX_SYMBOLS-1``, most frequent combination first; rare combinations
        beyond ``MAX_SYMBOLS - 1`` share the last id.

    Raises:
        InputError: no features, or features of different lengths.
    """
    if not features:
        raise InputError("encode_symbols: need at least one feature")
    cols = [np.asarray(f) for f in features]
    n = len(cols[0])
    if any(c.ndim != 1 or len(c) != n for c in cols):
        raise InputError("encode_symbols: features must be 1-D arrays of the same length")
    codes = np.zeros(n, dtype=np.int64)
    for c in cols:
        _, inv = np.unique(c, return_inverse=True)
        codes = codes * (int(inv.max(initial=0)) + 1) + inv.astype(np.int64)
    uniq, inv, counts = np.unique(codes, return_inverse=True, return_counts=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(len(uniq))
    return np.minimum(rank[inv], MAX_SYMBOLS - 1).astype(np.int64)


def _autocorr_sums(x: FloatArray, maxlag: int) -> FloatArray:
    """``out[k] = sum_i x[i] * x[i+k]`` for ``k = 0..maxlag`` along the last axis, via FFT."""
    n = x.shape[-1]
    size = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(x, size, axis=-1)
    ac = np.fft.irfft(f * np.conj(f), size, axis=-1)[..., : maxlag + 1]
    return np.asarray(ac, dtype=np.float64)


def symbol_mismatch(symbols: IntArray, maxlag: int) -> FloatArray:
    """Fraction of calls whose symbol differs from the one ``k`` calls later, for ``k = 0..maxlag``."""
    n = len(symbols)
    k = int(symbols.max(initial=0)) + 1
    onehot = np.zeros((k, n), dtype=np.float64)
    onehot[symbols, np.arange(n)] = 1.0
    matches = np.rint(_autocorr_sums(onehot, maxlag).sum(axis=0))
    return np.asarray(1.0 - matches / (n - np.arange(maxlag + 1)), dtype=np.float64)


def gap_signal(t_start: FloatArray) -> FloatArray | None:
    """Standardised log idle gap before each call, or ``None`` when the gaps carry no structure.

    Gaps are scaled by their median and compressed with ``log1p`` so that the long compute gaps
    dominate and the jitter of back-to-back calls (microseconds) does not.
    """
    gaps = np.diff(t_start)
    if len(gaps) == 0:
        return None
    gaps = np.maximum(gaps, 0.0)  # calls from several threads may interleave slightly out of order
    scale = float(np.median(gaps))
    if scale <= 0:
        pos = gaps[gaps > 0]
        if len(pos) == 0:
            return None
        scale = float(pos.min())
    x = np.log1p(gaps / scale)
    x = np.concatenate(([float(np.median(x))], x))  # the first call has no gap before it
    # Winsorise: one start-up or checkpoint stall (seconds among milliseconds) must not own the variance.
    lo, hi = np.percentile(x, [0.5, 99.5])
    x = np.clip(x, lo, hi)
    sd = float(x.std())
    if sd < 1e-9:
        return None
    return np.asarray((x - x.mean()) / sd, dtype=np.float64)


def _cv_rss(z: FloatArray, k: int) -> float:
    """Two-fold cross-validated residual of a ``k``-periodic template of ``z`` (per-phase means).

    Whole periods alternate between the folds: the template fitted on one fold predicts the other.
    Cross-validation makes lags of different lengths comparable — a long template over-fits the
    jitter and pays for it on the held-out fold — so no degrees-of-freedom correction or Gaussian
    test (both fragile with heavy-tailed, heteroscedastic gaps) is needed.
    """
    n = len(z)
    idx = np.arange(n)
    phase = idx % k
    fold = (idx // k) % 2
    cell = phase + k * fold  # one bincount for both folds' templates
    sums = np.bincount(cell, weights=z, minlength=2 * k).reshape(2, k)
    cnt = np.bincount(cell, minlength=2 * k).reshape(2, k)
    means = np.where(cnt > 0, sums / np.maximum(cnt, 1), 0.0)
    r = z - means[1 - fold, phase]  # each fold predicted by the other's template
    return float(r @ r)


def _blocks_differ(z: FloatArray, d: int, k: int) -> bool | None:
    """Whether a ``k``-periodic gap profile really differs between its ``k / d`` blocks of ``d`` calls.

    This is what separates an iteration from a repeated micro-batch: the micro-batches of one
    iteration look alike, except that one of them is followed by the optimizer step, data loading or
    a gradient all-reduce - a gap that is there in *every* iteration. Per call position, the median
    over iterations of each block is compared; a difference of more than ``BLOCK_Z`` robust standard
    errors (and ``BLOCK_MIN`` of the signal's spread) at any position means the blocks differ. Medians
    and MADs keep the test honest under the heavy-tailed, uneven jitter of a loaded machine, where a
    residual-based comparison drowns a small but systematic optimizer gap.

    Returns:
        ``None`` when fewer than ``BLOCK_MIN_REPEATS`` iterations of ``k`` calls are available.
    """
    m = len(z) // k
    if m < BLOCK_MIN_REPEATS or k % d:
        return None
    x = z[: m * k].reshape(m, k // d, d)
    med = np.median(x, axis=0)  # (blocks, d)
    mad = np.median(np.abs(x - med[None]), axis=0) * 1.4826
    # Standard error of a median; the MAD is floored because positions whose gaps are all alike (calls
    # issued back to back) have a MAD of zero, and any difference there would look infinitely significant.
    se = 1.2533 * np.maximum(mad, BLOCK_MAD_FLOOR) / np.sqrt(m)
    hi, lo = med.argmax(axis=0), med.argmin(axis=0)
    cols = np.arange(d)
    gap = med[hi, cols] - med[lo, cols]
    zscore = gap / np.sqrt(se[hi, cols] ** 2 + se[lo, cols] ** 2)
    return bool(np.any((zscore > BLOCK_Z) & (gap > BLOCK_MIN)))


def _divisors(k: int) -> list[int]:
    small = [d for d in range(1, int(k**0.5) + 1) if k % d == 0]
    return sorted(set(small + [k // d for d in small]))


def _choose_by_gaps(z: FloatArray, allowed: npt.NDArray[np.bool_], maxlag: int) -> tuple[int, float]:
    """Smallest allowed lag whose periodic gap template predicts held-out periods as well as any other."""
    n = len(z)
    ac = _autocorr_sums(z, maxlag) / (n - np.arange(maxlag + 1))
    lags = np.flatnonzero(allowed[1:]) + 1
    if len(lags) == 0:
        raise InputError("no candidate lag")
    top = lags[np.argsort(-ac[lags], kind="stable")[:SHORTLIST]]
    shortlist = {int(k) for k in top} | {int(lags[0])} | {int(k) for k in lags[lags <= 8]}
    cv = {k: _cv_rss(z, k) for k in shortlist}
    best = min(shortlist, key=lambda k: (cv[k], k))
    # A divisor of the best lag that predicts (almost) as well is the real period; the best lag is
    # then a multiple that only fitted the jitter.
    for d in _divisors(best):
        if d == best:
            break
        if not allowed[d]:
            continue
        differ = _blocks_differ(z, d, best)
        if differ is False:
            # Alike within `best` may only mean too few repeats of `best` to see it: a shorter multiple
            # of `d` inside `best` has more repeats, and its blocks must look alike too.
            differ = any(_blocks_differ(z, d, m) is True for m in _divisors(best) if d < m < best and m % d == 0)
        if differ is None:  # too few repeats for the robust test: compare prediction errors
            if d not in cv:
                cv[d] = _cv_rss(z, d)
            # Slack: relative (jitter-dominated streams), sampling noise of a residual over n calls,
            # and a floor relative to all structure (near-noiseless streams whose residuals are tiny).
            slack = cv[best] * (REL_RSS_SLACK + 2.0 * np.sqrt(2.0 / n)) + ABS_RSS_SLACK * float(z @ z)
            differ = cv[d] > cv[best] + slack
        if not differ:
            best = d
            if d not in cv:
                cv[d] = _cv_rss(z, d)
            break
    conf = max(0.0, 1.0 - cv[best] / max(float(z @ z), 1e-300))
    return best, conf


def find_cycle(x: npt.ArrayLike, max_cycle: int = MAX_CYCLE) -> int:
    """Shortest cycle ``m >= 2`` that a series repeats (1 when it does not).

    A period inference that answers a fraction of the true period reports iteration times that are
    themselves periodic (e.g. ``[a, b, c, a, b, c, ...]`` for a third of the period): each "iteration" is one
    part of the real one. The test is a one-way analysis of variance of the values grouped by phase ``i % m``
    (p-value below `CYCLE_P`, at least two whole cycles); of the significant cycles the strongest is taken,
    then its shortest divisor that explains the series about as well.

    Args:
        x: The series (e.g. log iteration times).
        max_cycle: Longest cycle considered.
    """
    v = np.asarray(x, dtype=np.float64)
    k = len(v)
    if k < 4 or not np.isfinite(v).all():
        return 1
    tot = float(((v - v.mean()) ** 2).sum())
    if tot <= 1e-12 * max(1.0, float(v @ v)):
        return 1
    within: dict[int, float] = {}
    pval: dict[int, float] = {}
    for m in range(2, min(max_cycle, k // 2) + 1):
        ph = np.arange(k) % m
        means = np.bincount(ph, weights=v, minlength=m) / np.bincount(ph, minlength=m)
        w = float(((v - means[ph]) ** 2).sum())
        within[m] = w
        if w <= 1e-12 * tot:
            pval[m] = 0.0
        else:
            f = ((tot - w) / (m - 1)) / (w / (k - m))
            pval[m] = float(fdtrc(m - 1, k - m, f))
    sig = [m for m in pval if pval[m] < CYCLE_P]
    if not sig:
        return 1
    best = min(sig, key=lambda m: (pval[m], m))
    for d in _divisors(best):
        if 1 < d < best and d in sig and within[d] <= 1.5 * within[best] + 1e-9 * tot:
            return d
    return best


def regularity(iteration_s: npt.ArrayLike) -> float:
    """How regular iteration times are, in [0, 1]: 1 minus their robust coefficient of variation / `IRREGULAR_CV`.

    A period that is the iteration gives times that vary only with jitter and load; a fraction or a
    chance lag of a call stream gives times that are parts of iterations, of very different lengths. The
    score is also scaled down by the share of the total time in "iterations" longer than `OUTLIER_FACTOR`
    times the median (0 at `OUTLIER_SHARE`).
    """
    d = np.asarray(iteration_s, dtype=np.float64)
    d = d[np.isfinite(d) & (d > 0)]
    if len(d) < 2:
        return 0.0
    med = float(np.median(d))
    rcv = 1.4826 * float(np.median(np.abs(d - med))) / med
    # Recurring long "iterations" that hold much of the time (the gaps between real iterations, seen by a
    # period of one call) are no jitter, however alike the others are.
    share = float(d[d > OUTLIER_FACTOR * med].sum()) / float(d.sum())
    return float(np.clip(1.0 - rcv / IRREGULAR_CV, 0.0, 1.0) * np.clip(1.0 - share / OUTLIER_SHARE, 0.0, 1.0))


@dataclass(frozen=True)
class GapSplit:
    """Iterations found from the gap structure alone: the calls split at the gaps between iterations.

    Attributes:
        starts: Index of the first call of each iteration found (the call after each boundary gap, and
            call 0 when the calls before the first boundary gap make a whole iteration).
        counts: Calls of each whole iteration (between consecutive ``starts``).
        iteration_s: Durations of those iterations, first call to first call of the next.
        ratio: Smallest boundary gap over the largest gap inside an iteration (before folding).
        fold: Boundary gaps per iteration: more than 1 when the split gaps repeated in a cycle of
            ``fold`` (parts of an iteration) and were folded to every ``fold``-th one.
        confidence: In [0, 1] (see `split_by_gaps`).
    """

    starts: IntArray
    counts: IntArray
    iteration_s: FloatArray
    ratio: float
    fold: int
    confidence: float

    @property
    def period(self) -> int:
        """Calls per iteration (the median when counts vary)."""
        return int(np.rint(np.median(self.counts)))

    @property
    def exact(self) -> bool:
        """Every whole iteration has the same number of calls."""
        return bool((self.counts == self.counts[0]).all())


def _split_at(t: FloatArray, g: FloatArray, big: IntArray, ratio: float) -> GapSplit | None:
    """The split of ``t`` at gaps ``big`` (indices into ``g``, ascending), checked and folded; or ``None``."""
    n = len(t)
    fold = 1
    if len(big) >= 4:
        fold = find_cycle(np.log(np.maximum(g[big], SPLIT_FLOOR_S)))
        if fold > 1:
            # The split gaps are parts of iterations (e.g. the groups of a pipeline schedule): the iteration
            # boundary is the phase whose gaps are longest (optimizer step, data loading).
            ph = np.arange(len(big)) % fold
            lg = np.log(np.maximum(g[big], SPLIT_FLOOR_S))
            keep = int(np.argmax(np.bincount(ph, weights=lg, minlength=fold) / np.bincount(ph, minlength=fold)))
            big = big[ph == keep]
    b = big + 1  # first call after each boundary gap
    counts = np.diff(b)
    first, last = int(b[0]), n - int(b[-1])
    ref = counts if len(counts) else np.array([first, last])
    med = float(np.median(ref))
    tol = int(SPLIT_COUNT_TOL * med)
    if med < 2 or (np.abs(ref - med) > tol).any() or last > med + tol:
        return None
    starts = b
    if abs(first - med) <= tol:
        starts = np.concatenate(([0], b))  # the capture began with a whole iteration
    cnt = np.diff(starts)
    if len(cnt) == 0 or (len(cnt) == 1 and len(b) > 1):
        # One whole iteration between two long gaps says nothing about its length (two stalls, a start-up
        # wait): it takes two whole iterations, or one boundary with alike counts on both sides.
        return None
    exact = bool((cnt == cnt[0]).all())
    conf = 0.95 * (0.75 if len(cnt) == 1 else 1.0) * (1.0 if exact else 0.9)
    if fold > 1:
        conf *= 0.85 if len(big) >= 3 else 0.5  # folding needs three whole cycles of the split gaps
    return GapSplit(starts=starts.astype(np.int64), counts=cnt.astype(np.int64),
                    iteration_s=np.diff(t[starts]), ratio=ratio, fold=fold, confidence=conf)


def _schedule(s: IntArray | None, period: int) -> bool:
    """Whether symbols repeat at lag ``period`` (>= `SYMBOL_SCHEDULE`) and at no shorter lag: a schedule."""
    if s is None or period < SYMBOL_SCHEDULE or len(s) < 2 * period:
        return False
    mis = [float(np.mean(s[:-k] != s[k:])) for k in range(1, period + 1)]
    return mis[-1] <= SYMBOL_PERIODIC and min(mis[:-1]) > SYMBOL_PERIODIC


def split_by_gaps(t_start: npt.ArrayLike, symbols: npt.ArrayLike | None = None) -> GapSplit | None:
    """Split a call stream at gaps far longer than every other gap, when they make consistent iterations.

    Between two iterations a trainer runs its optimizer step and loads data, issuing no call; inside an
    iteration the calls follow each other within the backward pass. When every gap of one group is at
    least `SPLIT_RATIO` times every other gap (`SPLIT_RATIO_SCHEDULE` when the split is neither folded nor of
    varying counts and either the ``symbols`` show a schedule of exactly its calls or its iterations hold at
    least `SPLIT_MANY_ALIKE` calls: a micro-batch of a few alike calls is split off by compute gaps about
    2-3 times the gaps inside it, and only the symbols or a large count rule it out), and the calls between
    them make iterations of the same count (within `SPLIT_COUNT_TOL`), the iterations are those (a split whose
    inner gaps are all zero only separates calls issued together): decisive from two iterations on, where the
    autocorrelation needs many repeats. Candidate groups are tried from the fewest (largest) gaps on. If the
    gaps of a group themselves repeat in a cycle (the groups of a pipeline schedule, each split off by
    its own compute gap), every ``cycle``-th one is an iteration boundary: the split is folded.

    Confidence: 0.95 for at least two whole iterations of equal counts; times 0.75 with one whole
    iteration, 0.9 when counts vary, 0.85 for a fold (0.5 with fewer than three whole cycles).

    Returns:
        The split, or ``None`` when no group of gaps stands out or none makes consistent iterations.
    """
    t = np.asarray(t_start, dtype=np.float64)
    n = len(t)
    if t.ndim != 1 or n < 4 or not np.isfinite(t).all():
        return None
    sym = None if symbols is None else np.asarray(symbols, dtype=np.int64)
    if sym is not None and (len(sym) != n or not (sym != sym[0]).any()):
        sym = None
    g = np.maximum(np.diff(t), 0.0)
    order = np.argsort(-g, kind="stable")
    gs = np.maximum(g[order], SPLIT_FLOOR_S)
    r = gs[:-1] / gs[1:]
    ok = (r >= SPLIT_RATIO_SCHEDULE) & (gs[1:] > SPLIT_FLOOR_S)
    cands = np.flatnonzero(ok)[:SPLIT_CANDIDATES] + 1  # K = number of boundary gaps
    for k in cands:
        if n - 1 - k < k:  # fewer gaps inside iterations than between them: not iterations of calls
            break
        sp = _split_at(t, g, np.sort(order[:k]), float(r[k - 1]))
        if sp is None:
            continue
        if sp.ratio >= SPLIT_RATIO or (sp.fold == 1 and sp.exact
                                       and (sp.period >= SPLIT_MANY_ALIKE or _schedule(sym, sp.period))):
            return sp
    return None


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
            and (max_period is None or split.period <= max_period) and _symbols_repeat(s, split.period):
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
        period, gap_conf = _choose_by_gaps(z, allowed, maxlag)
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


def _symbols_repeat(s: IntArray | None, period: int) -> bool:
    """Whether symbols (if any) repeat at lag ``period`` (or are too few to tell)."""
    if s is None or len(s) <= period:
        return True
    return float(np.mean(s[:-period] != s[period:])) <= SYMBOL_PERIODIC


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
    its = np.diff(_centroids(t, complete, period))
    if check:
        confidence = max(confidence, regularity(its)) * min(1.0, len(its) / 4)
        if confidence >= CONFIDENCE_MIN and len(its) >= 4 and find_cycle(np.log(np.maximum(its, 1e-12))) > 1:
            confidence *= 0.2
    return PeriodEstimate(period=period, phase=phase, confidence=min(1.0, max(0.0, confidence)),
                          boundaries=b, boundary_times=t[b], iteration_s=its)


def _centroids(t: FloatArray, starts: IntArray, period: int) -> FloatArray:
    """Mean start time of the calls of each iteration (iterations begin at ``starts``).

    Differences of centroids are iteration durations in which every call of the iteration votes, not
    only the boundary call: the jitter of one call's timing is divided by the period, and over any
    run of iterations the durations still add up exactly (they telescope).
    """
    if len(starts) == 0:
        return np.empty(0)
    cs = np.concatenate(([0.0], np.cumsum(t - t[0])))
    return np.asarray((cs[starts + period] - cs[starts]) / period + t[0], dtype=np.float64)


def _trust_switch(t: FloatArray, new: int, cur: int) -> bool:
    """Whether a period found on a recent slice of calls may replace the current one.

    A period unrelated to the current one is a change of schedule (a different pipeline). A *divisor*
    of the current period is also what a short slice shows when its few iterations cannot reveal the
    once-per-iteration gap; it replaces the current period only if the robust block test on the slice
    has enough repeats and finds the blocks alike. A *multiple* (more micro-batches, or jitter fitted
    by a long template on a loaded machine) needs the block test to find its blocks different.
    """
    if cur % new and new % cur:
        return True
    z = gap_signal(t)
    if z is None:
        return True
    if new % cur == 0:
        # A multiple of the current period is also what a short, jittery slice over-fits: it replaces
        # the current period only when the robust block test sees its blocks really differ.
        return _blocks_differ(z, cur, new) is True
    return _blocks_differ(z, new, cur) is False


def _periodic_start(symbols: IntArray | None, period: int) -> int:
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


@dataclass(frozen=True)
class PeriodVerdict:
    """What one `PeriodTracker.update` learned.

    Attributes:
        period: Calls per iteration: the last period locked in (kept while a change alarm is being
            re-estimated), or ``None`` before the first.
        changed: The period changed (or was first found) in this update.
        iteration_s: Durations of iterations completed in this update, oldest first.
        iteration_end_t: Time (same clock as the input) each of those iterations ended.
        iterations_total: Iterations emitted since the tracker was created.
        mean_iteration_s: Mean over the last ``window`` emitted iterations, or ``None`` if none yet.
        last_iteration_end_t: End time of the most recent emitted iteration, or ``None``.
        confidence: Confidence in ``period`` (0 when none), from the latest estimate of it on the current
            stretch; cut below `CONFIDENCE_MIN` when the gap split finds whole iterations of another length.
            Below `CONFIDENCE_MIN` the period and its iteration times are not to be shown.
    """

    period: int | None
    changed: bool
    iteration_s: FloatArray
    iteration_end_t: FloatArray
    iterations_total: int
    mean_iteration_s: float | None
    last_iteration_end_t: float | None
    confidence: float


@dataclass
class PeriodTracker:
    """Streaming iteration tracker over one process's call stream, with bounded memory.

    Feed batches of calls in order with `update`; each completed iteration is reported once.

    Attributes:
        buffer: Calls kept for (re-)estimation; the largest detectable period is ``buffer // min_repeats``.
        window: Iterations averaged for ``mean_iteration_s``.
        min_repeats: Iterations needed before a period is trusted.
        refresh: Re-estimate after this many new calls even without a detected change (catches changes
            the symbols cannot show, e.g. Send/Recv-only streams whose micro-batch count changed).
        origin: The first call fed is the first call the process made (its ring was read from the
            first record). The first iteration then begins where the calls start repeating, and
            iteration boundaries are anchored there: the trainer's own iteration begins at that call.
        together: Times are exact (nanosecond clocks) and calls issued together (one
            ``batch_isend_irecv``, as the torch hook records it) share one start time: whether a call
            was issued together with the one before it becomes part of its kind. This is call
            structure, not timing, and no load changes it: on a pipeline stage whose calls all look
            alike (the same Recv/Send pair per micro-batch) the iteration's first Recv, the only one
            not batched with a Send, tells the iteration from a micro-batch and shows a change of the
            micro-batch count at once. Leave it off for coarse clocks (a CSV in milliseconds), where
            unrelated calls can share a time.

    Iteration boundaries, once found, stay on one grid: a re-estimate of the same period keeps them,
    and after a pattern change the new iterations start on a boundary of the old grid (schedules
    change between iterations). Only without any anchor (a stream joined mid-run, or records lost)
    is the phase chosen from the gaps (the call after the longest median gap).
    """

    buffer: int = 8192
    window: int = 20
    min_repeats: int = 4
    refresh: int = 2048
    origin: bool = False
    together: bool = False
    _t: FloatArray = field(default_factory=lambda: np.empty(0), repr=False)
    _te: FloatArray = field(default_factory=lambda: np.empty(0), repr=False)
    _keys: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty((0, 0), dtype=np.int64), repr=False)
    _base: int = 0  # absolute index of _t[0]
    _seg: int = 0  # absolute index where the current stationary stretch starts
    _period: int | None = None
    _conf: float = 0.0
    _shown_conf: float = 0.0  # confidence in the period shown (see `PeriodVerdict.confidence`)
    _anchor: int = 0  # absolute index of a boundary of the current period
    _last_b: int | None = None  # absolute index of the last boundary already emitted
    _since_est: int = 0
    _next_try: int = 0
    _total: int = 0
    _recent: deque[float] = field(default_factory=deque, repr=False)
    _last_end: float | None = None
    _last_seq: int | None = None
    _tmpl: FloatArray | None = field(default=None, repr=False)
    _scale: float = 1.0
    _corr_min: float = -1.0
    _changed_by_gaps: bool = False
    _last_quick: int = 0
    _est_len: int = 0
    _suspect: int | None = None
    _cand: int | None = None  # period of the last estimate on this stretch (lock-in needs two alike)
    _seg_origin: bool = True  # the current stretch starts at the stream's origin
    _grid: tuple[int, int] | None = None  # (boundary, period) of the grid before a pattern change
    _resume: int | None = None  # first unreported boundary before a restart (continue there if unchanged)
    _mark_end: bool = True  # mark iterations by the end of their last call (else the start of the first)
    _never_zero: npt.NDArray[np.bool_] | None = field(default=None, repr=False)  # positions whose gap never was 0
    _always_zero: npt.NDArray[np.bool_] | None = field(default=None, repr=False)  # ... always was 0 (issued together)
    _shown: int | None = None  # the period reported: the last one locked in, kept while re-estimating
    _out: tuple[list[float], list[float]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.buffer < 16 or self.window < 1 or self.min_repeats < 2 or self.refresh < 1:
            raise InputError("PeriodTracker: buffer >= 16, window >= 1, min_repeats >= 2, refresh >= 1")
        self._recent = deque(maxlen=self.window)

    @property
    def period(self) -> int | None:
        """Calls per iteration: the last period locked in (kept while a change is being re-estimated;
        ``None`` until the first one)."""
        return self._shown

    def _end(self) -> int:
        return self._base + len(self._t)

    def update(
        self,
        t_start: npt.ArrayLike,
        *features: npt.ArrayLike,
        seq: npt.ArrayLike | None = None,
        t_end: npt.ArrayLike | None = None,
    ) -> PeriodVerdict:
        """Add calls (in order) and report iterations completed by them.

        Args:
            t_start: Start times of the new calls, seconds.
            *features: Per-call features that define a call's kind (op, communicator, bytes), each
                integer-valued; the same features in the same order on every update.
            seq: Optional per-call sequence numbers; a jump means records were lost, so the stretch
                restarts after it rather than mixing calls across the hole.
            t_end: Optional call end times (NaN where unknown). When known, iterations are marked
                at the start of their first call, or at the end of their last call when most of the
                iteration passes before the first call (see `_choose_marker`); otherwise between the
                mean start times of their calls.

        Raises:
            InputError: lengths differ, times are not finite, or the feature count changes.
        """
        t = np.asarray(t_start, dtype=np.float64).reshape(-1)
        if not np.isfinite(t).all():
            raise InputError("PeriodTracker.update: non-finite time")
        keys = np.stack([np.asarray(f, dtype=np.int64).reshape(-1) for f in features], axis=1) if features \
            else np.zeros((len(t), 0), dtype=np.int64)
        if keys.shape[0] != len(t):
            raise InputError("PeriodTracker.update: features and t_start differ in length")
        if self.together:
            prev = self._t[-1] if len(self._t) else np.nan
            keys = np.concatenate((keys, (np.diff(t, prepend=prev) == 0).astype(np.int64)[:, None]), axis=1)
        if self._keys.shape[1] != keys.shape[1]:
            if len(self._t):
                raise InputError("PeriodTracker.update: the number of features changed")
            self._keys = np.empty((0, keys.shape[1]), dtype=np.int64)
        new_start = self._end()
        period_before = self._shown
        emitted_s: list[float] = []
        emitted_t: list[float] = []
        self._out = (emitted_s, emitted_t)
        changed = False
        if len(t) == 0:
            return self._verdict(changed, emitted_s, emitted_t)
        if seq is not None:
            sq = np.asarray(seq, dtype=np.int64).reshape(-1)
            if len(sq) != len(t):
                raise InputError("PeriodTracker.update: seq and t_start differ in length")
            prev = np.concatenate(([self._last_seq if self._last_seq is not None else sq[0] - 1], sq[:-1]))
            holes = np.flatnonzero(sq != prev + 1)
            if len(holes):
                changed |= self._restart(new_start + int(holes[-1]), grid=False)
            self._last_seq = int(sq[-1])
        if t_end is None:
            te = np.full(len(t), np.nan)
        else:
            te = np.asarray(t_end, dtype=np.float64).reshape(-1)
            if len(te) != len(t):
                raise InputError("PeriodTracker.update: t_end and t_start differ in length")
        self._t = np.concatenate((self._t, t))
        self._te = np.concatenate((self._te, te))
        self._keys = np.concatenate((self._keys, keys))
        if len(self._t) > self.buffer:
            drop = len(self._t) - self.buffer
            self._t, self._te, self._keys = self._t[drop:], self._te[drop:], self._keys[drop:]
            self._base += drop
            if self._seg < self._base:
                self._seg, self._seg_origin = self._base, False
        self._since_est += len(t)

        if self._period is not None:
            # Symbol check of the new calls against one period earlier: a mismatch burst is a new pattern.
            # The two periods before the new calls are looked at again: whether two mismatches of a
            # change fall into one read must not depend on how often the exporter polls (a loaded machine
            # polls late, with bigger reads; a quiet one reads one iteration at a time), and the restart
            # snaps to the boundary before the *first* mismatch (else the first half of a longer new
            # iteration, read before the second mismatch, was reported as an iteration).
            lo = max(new_start - 2 * self._period, self._seg + self._period, self._base + self._period)
            if lo < self._end() and self._keys.shape[1]:
                cur = self._keys[lo - self._base:]
                ref = self._keys[lo - self._base - self._period: self._end() - self._base - self._period]
                bad = np.flatnonzero((cur != ref).any(axis=1))
                if len(bad) >= max(2, (self._end() - lo) // 50):
                    changed |= self._restart(lo + int(bad[0]))
        if self._shown is not None and self._shown_conf >= CONFIDENCE_MIN and self._recent \
                and self._end() - self._seg <= DOUBT_MAX_CALLS:
            # A gap far longer than the iterations shown, in a young stretch: maybe the first gap between the
            # real iterations (the period shown a fraction of them). Not stated until the next estimate.
            lo = max(new_start - 1, self._base) - self._base
            if len(self._t) - lo >= 2 and float(np.max(np.diff(self._t[lo:]))) > \
                    DOUBT_FACTOR * float(np.median(self._recent)):
                self._shown_conf = 0.5 * CONFIDENCE_MIN * self._shown_conf
        if self._period is not None and self._end() - self._last_quick >= 2 * self._period:
            changed |= self._quick_check()
        for _ in range(3):  # estimate, emit; a change seen while emitting re-estimates the rest
            # Re-estimate on a schedule, and whenever the stretch has doubled since the last estimate:
            # a young stream's first answer (few repeats) may be a micro-batch, not the iteration.
            grown = self._end() - self._seg >= 2 * self._est_len and self._est_len < self.buffer
            pending = self._cand is not None and self._cand != self._period  # a lock-in to confirm
            if (self._period is None or self._since_est >= self.refresh or grown or pending) \
                    and self._end() >= self._next_try:
                changed |= self._estimate()
            if self._period is None:
                break
            self._changed_by_gaps = False
            self._emit(emitted_s, emitted_t)
            if not self._changed_by_gaps:
                break
            changed = True
        # A false alarm that took the same period back within this update changed nothing.
        changed = changed and self._shown != period_before
        return self._verdict(changed, emitted_s, emitted_t)

    def flush(self) -> PeriodVerdict:
        """End of the stream: no later estimate can confirm a pending period, so adopt it now.

        Batch use (a whole recorded sequence) calls this after the last `update`; it reports the
        iterations of a period found but not yet locked in.
        """
        emitted_s: list[float] = []
        emitted_t: list[float] = []
        self._out = (emitted_s, emitted_t)
        changed = False
        if self._cand is not None and self._cand != self._period:
            changed = self._estimate(trusted=True)
            if self._period is not None:
                self._emit(emitted_s, emitted_t)
        return self._verdict(changed, emitted_s, emitted_t)

    def _quick_check(self) -> bool:
        """Re-estimate on the latest few iterations only; adopt a different period seen twice in a row.

        Cheap (a few periods of calls) and frequent, so a schedule change that the symbols cannot show
        (all calls alike) is found within a few iterations instead of at the next full refresh.
        """
        p = self._period
        self._last_quick = self._end()
        if p is None:
            return False
        n = min(self._end() - self._seg, 4 * self.min_repeats * p)
        if n < 2 * self.min_repeats * p:
            return False
        lo = self._end() - n - self._base
        sym = encode_symbols(*self._keys[lo:].T) if self._keys.shape[1] else None
        est = estimate_period(self._t[lo:], sym, min_repeats=self.min_repeats)
        if est is None or est.period == p or not _trust_switch(self._t[lo:], est.period, p):
            self._suspect = None
            return False
        if self._suspect != est.period:
            self._suspect = est.period
            return False
        self._suspect = None
        self._restart(self._end() - n)
        self._estimate()
        return True

    def _restart(self, at: int, *, grid: bool = True) -> bool:
        """Start a new stationary stretch at call ``at`` (absolute); returns whether a period was lost.

        With ``grid`` (a pattern change, not lost records) and a period in force, the stretch starts on
        the boundary of the current grid at or before ``at``: a schedule changes between iterations, so
        the first new iteration began there. Complete iterations before it are reported first.
        """
        was = self._period is not None
        self._grid, self._resume = None, None
        p, b = self._period, self._last_b
        if grid and p is not None and b is not None:
            snapped = b + ((at - b) // p) * p
            if snapped >= self._base:
                if self._out is not None:
                    # Complete old iterations are reported, except the one right before the change: it
                    # may be the first part of a longer new iteration (see `_phase_anchor`).
                    self._emit(*self._out, limit=snapped - p)
                at = snapped
                self._grid = (snapped, p)
                self._resume = self._last_b
        self._seg = max(at, self._base)
        self._seg_origin = False
        self._period, self._conf, self._last_b, self._next_try = None, 0.0, None, 0
        self._cand = None
        return was

    def _estimate(self, *, trusted: bool = False) -> bool:
        lo = self._seg - self._base
        t = self._t[lo:]
        self._since_est = 0
        self._est_len = len(t)
        if len(t) < 2 * self.min_repeats:
            return False
        sym = encode_symbols(*self._keys[lo:].T) if self._keys.shape[1] else None
        est = estimate_period(t, sym, min_repeats=self.min_repeats)
        if est is None:
            self._next_try = self._end() + max(8, len(t) // 4)
            return False
        p = est.period
        if p == self._shown:
            if p == self._period:  # not while a change is re-estimated on a short stretch
                self._shown_conf = est.confidence
        elif est.method == "gaps" and self._shown is not None:
            # Whole iterations of another length between gaps far longer than any other: the period shown is
            # wrong (e.g. a fraction of 400 alike calls per iteration, locked in before the first long gap).
            # No iteration time is shown until the new period is locked in.
            self._shown_conf = min(self._shown_conf, 0.2 * CONFIDENCE_MIN)
        if p == self._period:
            self._cand = p
            self._conf = est.confidence
            # Refit on reported iterations only: unreported ones may already follow a new schedule.
            self._fit_template(upto=self._last_b)
            return False
        # Lock-in: a period is adopted when its stretch holds LOCK_REPEATS repeats (enough for the block
        # test to have looked at twice the period) and an estimate on a stretch at most two thirds as
        # long (the previous one, else the first two thirds of this one) found it too. A young
        # stream's first answers are often a micro-batch or a multiple of the period; reporting their
        # iterations and switching later made the live gauge flap.
        # After a pattern change the new iterations are known to start on the old grid, and the gauge
        # should follow within a few iterations: half the repeats suffice there.
        repeats = LOCK_REPEATS if self._grid is None else LOCK_REPEATS // 2
        enough = len(t) >= repeats * p and (p == 1 or len(t) >= LOCK_MIN_CALLS)
        # After a change alarm, the period in force before it is taken back at once (false alarm, e.g.
        # one slow iteration, or the job's closing barrier).
        if self._grid is not None and p == self._grid[1]:
            # Taken back at once only if the iterations after the alarm look like the old template
            # again; a doubled count of alike micro-batches also first shows the old period.
            after = np.arange(self._seg + 3 * p, self._end() - p + 1, p, dtype=np.int64)
            trusted |= len(after) >= 2 and not self._iteration_bad(after, p).any()
        if enough and not trusted and self._grid is not None:
            old = self._grid[1]
            if p < old:
                # Shorter than before: a doubled count of alike micro-batches shows first as the
                # micro-batch itself. The blocks of p must look alike within twice the old period (so the
                # stretch must hold enough repeats of that) and within the old period.
                z = gap_signal(t)
                enough = z is not None and all(_blocks_differ(z, p, m) is False
                                               for m in (old, 2 * old) if m % p == 0)
            elif p != old and p % old == 0:
                enough = _trust_switch(t, p, old)  # a multiple needs the block test to see its blocks differ
            # The old period again with a different gap profile (a slowdown: a GC pause, a throttled
            # peer) is a new regime of the same schedule: locked in like any period, so iterations keep
            # being reported through a fault instead of waiting for the old profile to come back.
        if enough and not trusted:
            # Nor may a short multiple of p (2 to 4 times) show blocks of p that differ: then p is a
            # micro-batch whose once-per-iteration gap the estimate's few repeats did not reveal. Only
            # with MULTIPLE_REPEATS repeats of the multiple: at the block test's minimum it saw spurious
            # differences on real jobs.
            # Never for one call per iteration (gradient all-reduces of a DP-only job may alternate
            # even/odd), and not past 4 * LOCK_REPEATS repeats: a veto must not hold a period off forever.
            z = gap_signal(t) if p > 1 and len(t) < 4 * LOCK_REPEATS * p else None
            enough = z is None or not any(len(z) >= MULTIPLE_REPEATS * k * p and _blocks_differ(z, p, k * p) is True
                                          for k in (2, 3, 4))
        if not trusted and enough and p != self._cand and len(t) < 4 * LOCK_REPEATS * p:
            # No earlier estimate to agree with (e.g. a big first read): the first two thirds must agree.
            # (Not asked of a stretch with 4 times the repeats: a scrape of 10k new records.)
            k = (2 * len(t)) // 3
            early = estimate_period(t[:k], None if sym is None else sym[:k], min_repeats=self.min_repeats)
            trusted = early is not None and early.period == p
        trusted |= enough and len(t) >= 4 * LOCK_REPEATS * p
        if not (trusted or (enough and p == self._cand)):
            self._cand = p
            self._next_try = self._end() + max(p, len(t) // 3)
            return False
        self._cand = p
        if self._shown is not None and self._shown != p and self._shown_conf < CONFIDENCE_MIN:
            self._recent.clear()  # iterations of a period not trusted must not enter the new one's mean
        self._period, self._conf, self._shown, self._shown_conf = p, est.confidence, p, est.confidence
        anchor = self._phase_anchor(p, est, sym)
        # Never report an iteration twice, nor one that left the buffer. On an unchanged grid this
        # lands exactly on the first unreported boundary: reporting goes on without a gap.
        floor = max([self._base] + [b for b in (self._last_b, self._resume) if b is not None])
        if anchor < floor:
            anchor += -(-(floor - anchor) // p) * p
        self._anchor = anchor
        self._last_b = anchor
        self._mark_end = self._choose_marker()
        self._fit_template()
        return True

    def _phase_anchor(self, p: int, est: PeriodEstimate, sym: IntArray | None) -> int:
        """Absolute index of a call that begins an iteration of period ``p`` in the current stretch."""
        lo = self._seg
        if self._seg_origin and self.origin:
            return lo + _periodic_start(sym, p)
        if self._grid is not None:
            # The new iterations begin on the old grid: the first old boundary at or after the point from
            # which the new pattern repeats.
            gb, gp = self._grid
            i0 = lo + _periodic_start(sym, p)
            first = gb + -(-(i0 - gb) // gp) * gp
            cands = np.arange(first, i0 + p, gp, dtype=np.int64)
            if len(cands) <= 1:
                return first
            # Several old boundaries fall inside one new iteration (the symbols cannot tell which one
            # began it, e.g. twice the micro-batches of alike Send/Recv): the new iteration begins at
            # the one that kept the optimizer's gap before it, the longest median gap of them.
            g = np.concatenate(([0.0], np.maximum(np.diff(self._t[lo - self._base:]), 0.0)))
            med = [float(np.median(g[c - lo::p])) if len(g[c - lo::p]) else 0.0 for c in cands]
            j = int(np.argmax(med))
            a = int(cands[j])
            # The change may have been noticed one old block late (the first half of a longer new
            # iteration looked right): step back while the unreported call there has that gap too.
            floor = max(self._base + 1, self._resume if self._resume is not None else lo, gb - gp)
            while a - p >= floor and self._t[a - p - self._base] - self._t[a - p - 1 - self._base] >= 0.5 * med[j]:
                a -= p
            return a
        bounds = lo + est.boundaries
        # Emission resumes at the first new boundary not before what was already reported: the
        # iteration that straddles a pattern change mixes two schedules and is not reported.
        if self._last_b is not None:
            bounds = bounds[bounds >= self._last_b]
        return int(bounds[0]) if len(bounds) else lo + int(est.boundaries[-1])

    def _choose_marker(self) -> bool:
        """Whether iterations are marked by the end of their last call (else the start of their first).

        The trainer's iteration ends with its optimizer step, between the last call of one iteration and
        the first call of the next. The marker on the side with less other work between it and that
        step moves least with the load: the start of the first call when it follows the step closely (a
        pipeline stage receives its first activation right away), the end of the last call when the
        whole forward and backward pass lies before the first call (data parallel only: one gradient
        all-reduce per iteration).
        """
        p = self._period
        if p is None:
            return True
        first = np.arange(self._anchor, self._end() - p, p, dtype=np.int64)
        first = first[first - 1 >= max(self._seg, self._base)]
        if len(first) == 0:
            return True
        i = first - self._base
        idle = self._t[i] - self._te[i - 1]
        span = self._t[i + p] - self._t[i]
        ok = np.isfinite(idle) & (span > 0)
        if not ok.any():
            return True
        return bool(np.median(np.maximum(idle[ok], 0.0) / span[ok]) > MARK_END_IDLE)

    def _log_gaps(self, start: int, stop: int) -> FloatArray:
        """Scaled log gap before each call in absolute ``[start, stop)`` (first call of buffer: 0)."""
        i = np.arange(start, stop) - self._base
        prev = np.maximum(i - 1, 0)
        g = np.maximum(self._t[i] - self._t[prev], 0.0)
        return np.asarray(np.log1p(g / self._scale), dtype=np.float64)

    def _iteration_corr(self, starts: IntArray, p: int | None = None) -> FloatArray:
        """Correlation of each iteration's gap profile (iterations starting at ``starts``) with the template."""
        p = self._period if p is None else p
        if p is None or self._tmpl is None or len(self._tmpl) != p or len(starts) == 0:
            return np.ones(len(starts))
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        x = self._log_gaps(int(idx.min()), int(idx.max()) + 1)[idx - int(idx.min())].reshape(len(starts), p)
        xc = x - x.mean(axis=1, keepdims=True)
        tc = self._tmpl - self._tmpl.mean()
        den = np.sqrt((xc * xc).sum(axis=1) * float(tc @ tc))
        return np.where(den > 0, (xc @ tc) / np.maximum(den, 1e-300), 1.0)

    def _fit_template(self, upto: int | None = None) -> None:
        """Per-phase gap profile of the current stretch, and how well its own iterations match it.

        Later iterations are checked against it: a stream whose calls all look alike can only show a
        new schedule (e.g. more micro-batches) through its gaps.
        """
        p = self._period
        self._tmpl = self._never_zero = self._always_zero = None
        if p is None or p < 3:
            return
        lo = max(self._seg, self._base + 1)
        gaps = np.maximum(np.diff(self._t[lo - self._base - 1:]), 0.0)
        self._scale = max(float(np.median(gaps)), 1e-9) if len(gaps) else 1.0
        first = lo + ((self._anchor - lo) % p)
        stop = self._end() - p + 1 if upto is None else min(self._end() - p + 1, upto)
        starts = np.arange(first, stop, p, dtype=np.int64)
        if len(starts) < 2:
            return
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        x = self._log_gaps(first, int(idx.max()) + 1)[idx - first].reshape(len(starts), p)
        tmpl = np.median(x, axis=0)
        if float(np.ptp(tmpl)) <= 0:
            return
        self._tmpl = tmpl
        if len(starts) >= ZERO_MIN_ITERATIONS:
            self._never_zero, self._always_zero = (x > 0).all(axis=0), (x == 0).all(axis=0)
        base = self._iteration_corr(starts)
        med = float(np.median(base))
        mad = float(np.median(np.abs(base - med)))
        self._corr_min = med - max(CORR_DROP, 6.0 * mad)

    def _iteration_bad(self, starts: IntArray, p: int | None = None) -> npt.NDArray[np.bool_]:
        """Which iterations of ``p`` calls (default: the current period) starting at ``starts`` do not
        look like the template.

        Either the whole gap profile correlates poorly with the template, or the structure of the
        calls changed: a position that was never issued together with the call before it now is (the
        optimizer's gap before an iteration's first Recv is gone: this is the second half of a longer
        iteration of alike micro-batches), or calls always issued together (a batched Send/Recv pair)
        are apart. Jitter, however large on a loaded machine, changes neither.
        """
        p = self._period if p is None else p
        bad = self._iteration_corr(starts, p) < self._corr_min
        if p is None or self._never_zero is None or self._always_zero is None or len(self._never_zero) != p \
                or len(starts) == 0:
            return np.asarray(bad, dtype=bool)
        idx = (starts[:, None] + np.arange(p)[None, :]).reshape(-1)
        x = self._log_gaps(int(idx.min()), int(idx.max()) + 1)[idx - int(idx.min())].reshape(len(starts), p)
        out = bad | ((x == 0) & self._never_zero).any(axis=1) | ((x > 0) & self._always_zero).any(axis=1)
        return np.asarray(out, dtype=bool)

    def _emit(self, out_s: list[float], out_t: list[float], *, limit: int | None = None) -> None:
        """Report the iterations completed since the last report (those ending at or before ``limit``).

        Iteration ``k`` runs from boundary ``B[k]`` to ``B[k+1]``; it is marked on one side of each
        boundary (see `_choose_marker`), so reported durations telescope to the elapsed time.
        """
        p = self._period
        if p is None or self._last_b is None:
            return
        end = self._end()
        last = self._last_b
        if last < self._base:  # fell out of the buffer (should not happen with sane buffer sizes)
            last = self._base + ((self._anchor - self._base) % p)
        b = np.arange(last, end, p, dtype=np.int64)  # boundaries whose first call is here
        if limit is not None:
            b = b[b <= limit]
        restart_at = None
        if limit is None and len(b) >= 2:
            # Gap-profile check: two of three consecutive iterations that do not look like the template
            # mean the schedule changed (with twice the micro-batches of alike calls every other block
            # of the old length still looks right); restart estimation at the first of them. An
            # iteration is reported only once the next one looked right too, so the one before a
            # change (maybe the first half of a longer new iteration) is still unreported then.
            bad = self._iteration_bad(b[:-1])
            nb = len(bad)
            # Not from the first iteration of the stretch: a restart there re-estimates the same calls,
            # finds the same period and the same unlike first iterations, and so on forever (a last
            # stage whose start-up iterations were 10x slower on a loaded machine never reported one).
            # Unlike first iterations are a start-up transient; the blip rule below reports them.
            two = [k for k in range(nb) if bad[k] and (bad[k + 1:k + 3].any()) and b[k] > self._anchor]
            if two:
                restart_at = int(b[two[0]])
                b = b[: max(two[0] - 1, 0) + 1]
            else:
                # An iteration waits while it, or one of its next two (whose bad start would make it the
                # first half of a new iteration), is bad and not yet known to be a blip.
                n_ok = 0
                while n_ok + 1 < nb and not ((bad[n_ok] and n_ok + 2 >= nb) or
                                             (bad[n_ok + 1:n_ok + 3].any() and n_ok + 3 >= nb)):
                    n_ok += 1
                b = b[: n_ok + 1]
        ii = b - self._base
        if self._mark_end and len(b) and ii[0] < 1:
            b, ii = b[1:], ii[1:]  # the first boundary of the buffer has no previous call to mark it
        c: FloatArray | None = None
        if len(b) >= 2:
            if self._mark_end and ii[0] >= 1 and np.isfinite(self._te[ii - 1]).all():
                c = self._te[ii - 1]  # end of the last call of the previous iteration
            elif np.isfinite(self._te[ii[0]:ii[-1]]).all():
                c = self._t[ii]  # start of the first call of the iteration
            else:
                b = b[b + p <= end]  # no call end times: every call of an iteration votes
                ii = b - self._base
                if len(b) >= 2:
                    c = _centroids(self._t, ii, p)
        if c is not None:
            d = np.diff(c)
            ends = c[1:]
            out_s.extend(float(x) for x in d)
            out_t.extend(float(x) for x in ends)
            self._recent.extend(float(x) for x in d)
            self._total += len(d)
            self._last_end = float(ends[-1])
            self._last_b = int(b[-1])
        if restart_at is not None:
            self._restart(restart_at)
            self._changed_by_gaps = True

    def _verdict(self, changed: bool, s: list[float], t: list[float]) -> PeriodVerdict:
        return PeriodVerdict(
            period=self._shown, changed=changed,
            iteration_s=np.asarray(s, dtype=np.float64), iteration_end_t=np.asarray(t, dtype=np.float64),
            iterations_total=self._total,
            mean_iteration_s=float(np.mean(self._recent)) if self._recent else None,
            last_iteration_end_t=self._last_end, confidence=self._shown_conf if self._shown is not None else 0.0)


@dataclass(frozen=True)
class IterationResult:
    """Iterations found in a whole recorded call sequence (`infer_iterations`).

    Attributes:
        period: Calls per iteration at the end of the sequence (``None`` if never found; the median when
            the gap split found iterations of varying counts).
        periods: Every period adopted, in order (more than one when the pattern changed).
        iteration_s: Duration of every iteration found, in order.
        iteration_end_t: Time each of those iterations ended.
        confidence: In [0, 1]; below `CONFIDENCE_MIN` the period is not to be stated (see ``reason``).
        reason: Why the confidence is low (empty when it is not).
        method: ``"gaps"`` (split at the gaps between iterations, `split_by_gaps`) or ``"tracker"``
            (`PeriodTracker`, autocorrelation of symbols and gaps).
        fold: Parts per iteration when the answer was folded (a cycle in the split gaps or in the tracker's
            iteration times), else 1.
    """

    period: int | None
    periods: tuple[int, ...]
    iteration_s: FloatArray
    iteration_end_t: FloatArray
    confidence: float = 0.0
    reason: str = ""
    method: str = "tracker"
    fold: int = 1

    @property
    def median_s(self) -> float | None:
        """Median iteration time, or ``None`` when no iteration was found."""
        return float(np.median(self.iteration_s)) if len(self.iteration_s) else None


def infer_iterations(
    t_start: npt.ArrayLike,
    *features: npt.ArrayLike,
    chunk: int = 256,
    buffer: int = 8192,
    min_repeats: int = 4,
) -> IterationResult:
    """Iterations of a complete call sequence, with the confidence of the answer.

    First the gap split (`split_by_gaps`: iterations separated by gaps far longer than any other, decisive
    from two iterations on, folded when its gaps cycle). Otherwise a `PeriodTracker` runs over the
    calls as the exporter would see them arrive; its iteration times are then checked for a cycle: a
    period that is a fraction of the true one reports parts of iterations, in a repeating pattern. They
    are folded (summed ``cycle`` at a time, the longest part last) when the folded iterations are regular,
    and the answer is refused (confidence below `CONFIDENCE_MIN`) otherwise.

    Args:
        t_start: Call start times in seconds, in call order.
        *features: Integer per-call features (op, communicator, bytes, ...).
        chunk: Calls per update (the exporter's reads arrive in chunks too).
        buffer: Tracker buffer (largest period detectable is ``buffer // min_repeats``).
        min_repeats: Iterations needed before a period is trusted.

    Raises:
        InputError: features and times differ in length.
    """
    t = np.asarray(t_start, dtype=np.float64)
    feats = [np.asarray(f, dtype=np.int64) for f in features]
    if any(len(f) != len(t) for f in feats):
        raise InputError("infer_iterations: features and t_start differ in length")
    sym = encode_symbols(*feats) if feats and len(t) else None
    split = split_by_gaps(t, sym) if np.isfinite(t).all() else None
    if split is not None and split.confidence >= CONFIDENCE_MIN \
            and (not split.exact or _symbols_repeat(sym, split.period)):
        return IterationResult(period=split.period, periods=(split.period,), iteration_s=split.iteration_s,
                               iteration_end_t=t[split.starts[1:]], confidence=split.confidence, method="gaps",
                               fold=split.fold)
    tr = PeriodTracker(buffer=buffer, min_repeats=min_repeats, window=max(1, len(t)))
    periods: list[int] = []
    out_s: list[FloatArray] = []
    out_t: list[FloatArray] = []
    for i in range(0, len(t), chunk):
        v = tr.update(t[i:i + chunk], *(f[i:i + chunk] for f in feats))
        if v.changed and v.period is not None and (not periods or periods[-1] != v.period):
            periods.append(v.period)  # a false alarm (period lost, then the same one found) is no change
        out_s.append(v.iteration_s)
        out_t.append(v.iteration_end_t)
    v = tr.flush()
    if v.changed and v.period is not None and (not periods or periods[-1] != v.period):
        periods.append(v.period)
    out_s.append(v.iteration_s)
    out_t.append(v.iteration_end_t)
    its = np.concatenate(out_s) if out_s else np.empty(0)
    ends = np.concatenate(out_t) if out_t else np.empty(0)
    p = tr.period
    if p is None or len(its) == 0:
        return IterationResult(period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends,
                               reason=f"no periodic call pattern found in {len(t)} calls")
    conf = float(v.confidence)
    m = find_cycle(np.log(np.maximum(its, 1e-12))) if len(its) >= 4 else 1
    if m > 1:
        # Parts of iterations: fold m at a time so that each iteration ends with its longest part (the
        # one that holds the optimizer step).
        ph = np.arange(len(its)) % m
        last = int(np.argmax(np.bincount(ph, weights=its, minlength=m) / np.bincount(ph, minlength=m)))
        o = (last + 1) % m
        whole = (len(its) - o) // m
        folded = its[o:o + whole * m].reshape(whole, m).sum(axis=1)
        fends = ends[o:o + whole * m].reshape(whole, m)[:, -1]
        reg = regularity(folded)
        if whole >= 2 and reg >= 0.5:
            return IterationResult(period=p * m, periods=(p * m,), iteration_s=folded, iteration_end_t=fends,
                                   confidence=FOLD_CONFIDENCE * (1.0 if whole >= 3 else 0.8), method="tracker",
                                   fold=m)
        why = "too few whole iterations to check" if whole < 2 else "the folded iterations are irregular"
        return IterationResult(
            period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends, confidence=min(conf, 0.2),
            fold=1, reason=f"the iteration times found with period {p} repeat every {m} iterations, so {p} "
            f"calls are a fraction of the iteration; folded to {p * m} calls: {why}")
    reason = ""
    if conf < CONFIDENCE_MIN:
        causes: list[str] = []
        if len(its) < 4:
            causes.append(f"only {len(its)} whole iterations")
        if regularity(its) < 0.5:
            med = float(np.median(its))
            rcv = 1.4826 * float(np.median(np.abs(its - med))) / med
            share = float(its[its > OUTLIER_FACTOR * med].sum() / its.sum())
            causes.append(f"irregular iteration times: MAD / median {rcv:.0%}, {share:.0%} of the time in iterations "
                       f"over {OUTLIER_FACTOR:g}x the median")
        if split is not None and split.period != p:
            causes.append(f"the longest gaps split the calls into iterations of about {split.period} calls")
        reason = f"period {p} explains little of the call timing" + (f" ({'; '.join(causes)})" if causes else "")
    return IterationResult(period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends,
                           confidence=conf, reason=reason)
