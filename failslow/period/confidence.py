"""How far a period can be trusted: the confidence threshold, cycles in a series of iteration times, and
their regularity.

A period that is a fraction of the true one reports parts of iterations: their times repeat in a cycle
(`find_cycle`) or vary far more than jitter does (`regularity`). Both lower the confidence of an answer;
below `CONFIDENCE_MIN` a period is not stated.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
from scipy.special import fdtrc

from failslow.period.numeric import divisors

#: Confidence below which a period is not stated: `failslow period` exits 3 and the exporter shows no
#: iteration time for the rank.
CONFIDENCE_MIN: Final = 0.5
#: Longest cycle looked for in a series of iteration times (or of the gaps that split them).
MAX_CYCLE: Final = 8
#: A cycle counts when the one-way analysis of variance by phase has a p-value below this.
CYCLE_P: Final = 1e-4
#: Iteration times with a robust coefficient of variation (MAD / median) of this or more are irregular.
IRREGULAR_CV: Final = 0.5
#: ... and so are they when iterations longer than OUTLIER_FACTOR times the median hold OUTLIER_SHARE of the time.
OUTLIER_FACTOR: Final = 3.0
OUTLIER_SHARE: Final = 0.25


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
    for d in divisors(best):
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
