"""Calls as symbols: each call's kind (op, communicator, bytes, ...) as a small integer, and at which lags
the symbol sequence repeats.

If the sequence is P-periodic the symbol at ``i`` equals the symbol at ``i + P``; the mismatch rate at every
lag comes from FFT autocorrelations of the symbol indicators. This rules out every lag that is not a
multiple of the period, but cannot tell the period from a shorter repeating unit (a micro-batch of
identical calls) and says nothing when all calls look alike (a pipeline stage doing only Send/Recv).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.numeric import FloatArray, IntArray, autocorr_sums

#: Symbols beyond this many distinct ones are merged into one "other" symbol (keeps FFT work bounded).
MAX_SYMBOLS: Final = 64
#: Symbols are periodic at a lag when at most this fraction of calls differ from the call one lag later.
SYMBOL_PERIODIC: Final = 0.1
#: A lag counts as symbol-periodic when its mismatch rate is within this of the best lag's.
SYMBOL_SLACK: Final = 0.02
#: A symbol period of at least this many calls is a schedule: a multiple of it needs GAP_MIN_REPEATS.
SYMBOL_SCHEDULE: Final = 3


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


def symbol_mismatch(symbols: IntArray, maxlag: int) -> FloatArray:
    """Fraction of calls whose symbol differs from the one ``k`` calls later, for ``k = 0..maxlag``."""
    n = len(symbols)
    k = int(symbols.max(initial=0)) + 1
    onehot = np.zeros((k, n), dtype=np.float64)
    onehot[symbols, np.arange(n)] = 1.0
    matches = np.rint(autocorr_sums(onehot, maxlag).sum(axis=0))
    return np.asarray(1.0 - matches / (n - np.arange(maxlag + 1)), dtype=np.float64)


def is_schedule(s: IntArray | None, period: int) -> bool:
    """Whether symbols repeat at lag ``period`` (>= `SYMBOL_SCHEDULE`) and at no shorter lag: a schedule."""
    if s is None or period < SYMBOL_SCHEDULE or len(s) < 2 * period:
        return False
    mis = [float(np.mean(s[:-k] != s[k:])) for k in range(1, period + 1)]
    return mis[-1] <= SYMBOL_PERIODIC and min(mis[:-1]) > SYMBOL_PERIODIC


def symbols_repeat(s: IntArray | None, period: int) -> bool:
    """Whether symbols (if any) repeat at lag ``period`` (or are too few to tell)."""
    if s is None or len(s) <= period:
        return True
    return float(np.mean(s[:-period] != s[period:])) <= SYMBOL_PERIODIC


def marks_iteration(keys: npt.NDArray[np.int64], sync: npt.NDArray[np.bool_]) -> bool:
    """Whether one period's calls (`keys`: one row of features per call) hold a group collective (`sync`)
    of a kind that occurs once in them: the gradient synchronisation of a data-parallel step.

    Then the period is the iteration. A multiple of it found from timing alone is a pattern of the
    iterations' lengths (a CPU quota's 100 ms periods falling alike every other iteration made a stage of a
    DP2xPP2 job read 18 and 27 calls per iteration instead of 9), not micro-batches of one iteration:
    those would repeat their collectives, not hold one once.
    """
    return iteration_marker(keys, sync) is not None


def iteration_marker(keys: npt.NDArray[np.int64], sync: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64] | None:
    """The features of the first group collective that occurs once in one period's calls (see
    `marks_iteration`), or None."""
    if len(keys) == 0 or not sync.any():
        return None
    _, inv, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    once = np.flatnonzero((counts[inv.reshape(-1)] == 1) & sync)
    return keys[once[0]].copy() if len(once) else None
