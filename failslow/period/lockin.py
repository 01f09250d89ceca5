"""When the streaming tracker adopts a period it estimated: the lock-in rules of `PeriodTracker`.

A period is adopted when its stretch holds LOCK_REPEATS repeats (enough for the block test to have looked at
twice the period) and an estimate on a stretch at most two thirds as long (the previous one, else the first
two thirds of this one) found it too. A young stream's first answers are often a micro-batch or a multiple
of the period; reporting their iterations and switching later made the live gauge flap. After a pattern
change the new iterations are known to start on the old grid, and the gauge should follow within a few
iterations: half the repeats suffice there.
"""

from __future__ import annotations

from typing import Final

from failslow.period.acf import estimate_period
from failslow.period.folds import MULTIPLE_REPEATS, blocks_differ, trust_switch
from failslow.period.gaps import gap_signal
from failslow.period.numeric import FloatArray, IntArray

#: A tracker adopts a period when its stretch holds this many repeats of it and an estimate on a
#: shorter stretch (the previous one, or the first two thirds) agrees (lock-in hysteresis).
LOCK_REPEATS: Final = 16
#: ... and, for periods of several calls, at least this many calls (a period of 8 identical-looking
#: Send/Recv pairs shows as 2 until the block test can look at 4 times that).
LOCK_MIN_CALLS: Final = 96


def lock_in(t: FloatArray, sym: IntArray | None, p: int, *, old: int | None, cand: int | None, trusted: bool,
            min_repeats: int) -> tuple[bool, bool]:
    """Whether period ``p``, estimated on the stretch ``t`` (call start times; ``sym`` their symbols), may
    be adopted.

    Args:
        old: The period before a change alarm (None: no alarm, e.g. a young stream).
        cand: The period the previous estimate on this stretch found.
        trusted: Already known good (the old period back after a false alarm; the end of a stream).
        min_repeats: The estimator's minimum repeats.

    Returns:
        ``(enough, trusted)``: the stretch holds enough repeats and no rule vetoes ``p``; ``p`` needs no
        second estimate to agree. The tracker adopts ``p`` when trusted, or enough and ``p == cand``.
    """
    repeats = LOCK_REPEATS if old is None else LOCK_REPEATS // 2
    enough = len(t) >= repeats * p and (p == 1 or len(t) >= LOCK_MIN_CALLS)
    if enough and not trusted and old is not None:
        if p < old:
            # Shorter than before: a doubled count of alike micro-batches shows first as the
            # micro-batch itself. The blocks of p must look alike within twice the old period (so the
            # stretch must hold enough repeats of that) and within the old period.
            z = gap_signal(t)
            enough = z is not None and all(blocks_differ(z, p, m) is False for m in (old, 2 * old) if m % p == 0)
        elif p != old and p % old == 0:
            enough = trust_switch(t, p, old)  # a multiple needs the block test to see its blocks differ
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
        enough = z is None or not any(len(z) >= MULTIPLE_REPEATS * k * p and blocks_differ(z, p, k * p) is True
                                      for k in (2, 3, 4))
    if not trusted and enough and p != cand and len(t) < 4 * LOCK_REPEATS * p:
        # No earlier estimate to agree with (e.g. a big first read): the first two thirds must agree.
        # (Not asked of a stretch with 4 times the repeats: a scrape of 10k new records.)
        k = (2 * len(t)) // 3
        early = estimate_period(t[:k], None if sym is None else sym[:k], min_repeats=min_repeats)
        trusted = early is not None and early.period == p
    trusted |= enough and len(t) >= 4 * LOCK_REPEATS * p
    return enough, trusted
