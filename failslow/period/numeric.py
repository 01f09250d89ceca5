"""Array aliases and the numeric helpers the period modules share: FFT autocorrelation sums, divisors."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def autocorr_sums(x: FloatArray, maxlag: int) -> FloatArray:
    """``out[k] = sum_i x[i] * x[i+k]`` for ``k = 0..maxlag`` along the last axis, via FFT."""
    n = x.shape[-1]
    size = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(x, size, axis=-1)
    ac = np.fft.irfft(f * np.conj(f), size, axis=-1)[..., : maxlag + 1]
    return np.asarray(ac, dtype=np.float64)


def divisors(k: int) -> list[int]:
    """The divisors of ``k``, ascending (``k`` itself last)."""
    small = [d for d in range(1, int(k**0.5) + 1) if k % d == 0]
    return sorted(set(small + [k // d for d in small]))
