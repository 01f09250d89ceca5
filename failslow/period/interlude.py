"""Calls between iterations that are not the training's: where the iteration pattern comes back.

A job sometimes makes calls of another pattern for a moment and then trains on as before: a validation's
point-to-point tests at an iteration boundary (hundreds of pings and transfers in a second), a
checkpoint's barriers, a health check. The period tracker sees the calls stop matching one period
earlier and re-estimates; on a stretch holding the interlude its estimates are those of the interlude (a
validation's Send/Recv pairs read as 6 calls per iteration and were reported as such) until enough of the
old iterations have followed it. :func:`resumption` finds where the old iteration's calls come back, so the
tracker can go on with the period it had, the interlude counted in the iteration it interrupted.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Candidate resumption points examined per call (bounds the work on a long interlude of alike calls).
MAX_CANDIDATES = 4096


def resumption(keys: npt.NDArray[np.int64], p: int) -> tuple[int, int] | None:
    """Where the iteration ``keys[:p]`` comes back after an interlude.

    Args:
        keys: One row of features per call: the last iteration before the change (``keys[:p]``), then
            the calls since.
        p: Calls per iteration.

    Returns:
        ``(g, head)``: the first index ``g > p`` from which two whole iterations of calls exactly like
        ``keys[:p]`` follow (the first call of the pattern again), and ``head``, how many calls of that
        iteration came before the interlude (0: the interlude sat between two iterations). None while the
        pattern has not come back, came back at once, or the calls before it were all of the iteration's own
        kinds (no interlude).
    """
    n = len(keys)
    if p < 1 or n < 3 * p + 1:
        return None
    tmpl = keys[:p]
    after = keys[p:]
    head = 0
    while head < min(p, len(after)) and (after[head] == tmpl[head]).all():
        head += 1
    if head == p or head == len(after):
        return None  # the iteration after the change alarm went on as before: no interlude there
    twice = np.concatenate((tmpl, tmpl))
    cand = np.flatnonzero((after[:len(after) - 2 * p + 1] == tmpl[0]).all(axis=1))
    for j in cand[cand > head][:MAX_CANDIDATES]:
        if (after[j:j + 2 * p] == twice).all():
            # Calls of a kind the iteration does not make: an interlude. Only the iteration's own kinds in
            # between are its calls out of order or some of them lost: not this rule's to explain.
            between = after[head:j]
            foreign = ~(between[:, None, :] == tmpl[None, :, :]).all(axis=2).any(axis=1)
            return (p + int(j), head) if foreign.any() else None
    return None


def resumed_grid(keys: npt.NDArray[np.int64], base: int, s: int, p: int,
                 resume: int) -> tuple[npt.NDArray[np.int64], int] | None:
    """The boundaries to report once the iteration came back after an interlude, and the new grid's first.

    Args:
        keys: The tracker's buffer of call features; ``keys[0]`` is call ``base`` (absolute indices).
        base: Absolute index of ``keys[0]``.
        s: The boundary of the old grid where the change alarm restarted (the iteration before it is
            ``keys[s - p - base : s - base]``).
        p: The old period.
        resume: The last boundary already reported.

    Returns:
        ``(b, g)``: the old grid's boundaries from ``resume`` up to the interrupted iteration, then ``g``,
        where the iteration came back (see :func:`resumption`); the interlude falls in the last iteration
        of ``b``. None when ``resumption`` has no answer or the iteration before ``s`` left the buffer.
    """
    lo = s - p - base
    found = resumption(keys[lo:], p) if lo >= 0 and keys.shape[1] else None
    if found is None:
        return None
    g, head = s - p + found[0], found[1]
    return np.concatenate((np.arange(resume, s if head == 0 else s + 1, p, dtype=np.int64), [g])), g


def _spaced(keys: npt.NDArray[np.int64], marker: npt.NDArray[np.int64], p: int) -> npt.NDArray[np.intp] | None:
    """Where ``marker`` occurs in ``keys``, if every occurrence follows the one before it by ``p`` calls."""
    pos = np.flatnonzero((keys == marker).all(axis=1))
    return pos if bool((np.diff(pos) == p).all()) else None


def keeps_marker(keys: npt.NDArray[np.int64], marker: npt.NDArray[np.int64] | None, p: int) -> bool:
    """Whether the collective that marked the iterations before a change (``marker``, its features; None:
    none did) recurs every ``p`` calls over ``keys`` (the calls since the change), at least twice."""
    if marker is None:
        return True
    pos = _spaced(keys, marker, p)
    return pos is not None and len(pos) >= 2


def marker_every(keys: npt.NDArray[np.int64], marker: npt.NDArray[np.int64] | None, p: int, *, repeats: int,
                 lead: int) -> bool:
    """Whether the calls since a change (``keys``) are iterations of ``p`` calls by the collective that marked
    the iterations before it (``marker``, see `keeps_marker`): it comes within the first ``lead`` calls (the
    old period: a stretch may start with the rest of an old iteration when the old grid was not in phase
    with the trainer's), then every ``p`` calls, at least ``repeats`` times, and again within the last ``p``.

    The iteration's gradient synchronisation is no micro-batch's: a period it marks once in every repeat is
    the iteration, no fraction of it (one block of several would hold it) nor a multiple (twice).
    """
    if marker is None or p < 1:
        return False
    pos = _spaced(keys, marker, p)
    return pos is not None and len(pos) >= max(repeats, 1) and int(pos[0]) < max(lead, p) \
        and len(keys) - int(pos[-1]) <= p
