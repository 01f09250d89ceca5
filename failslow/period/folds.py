"""Which lag the gaps say is the period: a periodic template ("fold") of the gap signal fitted at each
candidate lag, cross-validation between a lag and its divisors, and the robust block test that tells an
iteration from a repeated micro-batch.

Autocorrelation of the gap signal (`failslow.period.gaps.gap_signal`) shortlists lags; the fold fitted at
each shortlisted lag and cross-validation between a lag and its divisors then pick the *smallest* lag that
explains the gaps as well as any multiple of it.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.gaps import gap_signal
from failslow.period.numeric import FloatArray, autocorr_sums, divisors

#: A divisor of the best lag replaces it when its cross-validated gap residual is at most this much larger.
REL_RSS_SLACK: Final = 0.05
#: ... or larger by at most this fraction of the gap signal's total variance.
ABS_RSS_SLACK: Final = 0.005
#: Robust block test (see `blocks_differ`): significance in standard errors, minimum difference in
#: units of the gap signal's standard deviation, and iterations needed to run it.
BLOCK_Z: Final = 4.5
BLOCK_MIN: Final = 0.05
BLOCK_MIN_REPEATS: Final = 8
BLOCK_MAD_FLOOR: Final = 0.1
#: Repeats of a multiple of the period the block test needs before it may say the multiple's blocks differ:
#: at the test's minimum (BLOCK_MIN_REPEATS) it saw spurious differences on real, loaded jobs.
MULTIPLE_REPEATS: Final = 12
#: Lags shortlisted from the gap autocorrelation for the fold test.
SHORTLIST: Final = 16


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


def blocks_differ(z: FloatArray, d: int, k: int) -> bool | None:
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


def choose_by_gaps(z: FloatArray, allowed: npt.NDArray[np.bool_], maxlag: int) -> tuple[int, float]:
    """Smallest allowed lag whose periodic gap template predicts held-out periods as well as any other."""
    n = len(z)
    ac = autocorr_sums(z, maxlag) / (n - np.arange(maxlag + 1))
    lags = np.flatnonzero(allowed[1:]) + 1
    if len(lags) == 0:
        raise InputError("no candidate lag")
    top = lags[np.argsort(-ac[lags], kind="stable")[:SHORTLIST]]
    shortlist = {int(k) for k in top} | {int(lags[0])} | {int(k) for k in lags[lags <= 8]}
    cv = {k: _cv_rss(z, k) for k in shortlist}
    best = min(shortlist, key=lambda k: (cv[k], k))
    # A divisor of the best lag that predicts (almost) as well is the real period; the best lag is
    # then a multiple that only fitted the jitter.
    for d in divisors(best):
        if d == best:
            break
        if not allowed[d]:
            continue
        differ = blocks_differ(z, d, best)
        if differ is False:
            # Alike within `best` may only mean too few repeats of `best` to see it: a shorter multiple
            # of `d` inside `best` has more repeats, and its blocks must look alike too.
            differ = any(blocks_differ(z, d, m) is True for m in divisors(best) if d < m < best and m % d == 0)
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


def trust_switch(t: FloatArray, new: int, cur: int) -> bool:
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
        # the current period only when the robust block test, over MULTIPLE_REPEATS repeats of it, sees its
        # blocks really differ.
        return len(z) >= MULTIPLE_REPEATS * new and blocks_differ(z, cur, new) is True
    return blocks_differ(z, new, cur) is False
