"""The idle gaps between calls: the gap signal, and the split of a call stream at the gaps between iterations.

The idle time before each call, on a log scale, is periodic with the iteration: the optimizer step, data
loading and the forward pass leave a long gap once per iteration that micro-batch repetitions do not have.
`gap_signal` is that time series, standardised (the lag choice of `failslow.period.folds` works on it).
When the gaps between iterations are far longer than every gap inside one, `split_by_gaps` cuts the stream
there directly: decisive from two iterations on, where the autocorrelation needs many repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.period.confidence import find_cycle
from failslow.period.numeric import FloatArray, IntArray
from failslow.period.symbols import is_schedule

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
                                       and (sp.period >= SPLIT_MANY_ALIKE or is_schedule(sym, sp.period))):
            return sp
    return None
