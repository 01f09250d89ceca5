"""The streaming period tracker: `PeriodTracker.update(batch) -> PeriodVerdict` over one process's calls.

With a bounded buffer, it emits each completed iteration once, re-estimates periodically
(`failslow.period.acf.estimate_period`), and restarts estimation when the call pattern changes (e.g. the
micro-batch count changes: a symbol mismatch, a quick re-estimate on the latest iterations, or iterations
unlike the gap template of `failslow.period.template`) or when records were lost. Where iterations begin
and where they are marked is `failslow.period.boundaries`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.acf import DOUBT_FACTOR, DOUBT_MAX_CALLS, PeriodEstimate, estimate_period
from failslow.period.boundaries import iteration_marks, mark_at_end, phase_anchor
from failslow.period.confidence import CONFIDENCE_MIN
from failslow.period.folds import MULTIPLE_REPEATS, trust_switch
from failslow.period.interlude import keeps_marker, marker_every, resumed_grid
from failslow.period.lockin import LOCK_REPEATS, lock_in
from failslow.period.numeric import FloatArray, IntArray
from failslow.period.symbols import encode_symbols, iteration_marker, marks_iteration
from failslow.period.template import GapTemplate
from failslow.period.verdict import PeriodVerdict


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
    _sync: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=bool), repr=False)
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
    _gaps: GapTemplate = field(default_factory=GapTemplate, repr=False)  # gap profile of the current period
    _changed_by_gaps: bool = False
    _last_quick: int = 0
    _est_len: int = 0
    _suspect: int | None = None
    _partial: int = 0  # calls between the collectives while the period in force is a fraction of the iteration
    _cand: int | None = None  # period of the last estimate on this stretch (lock-in needs two alike)
    _seg_origin: bool = True  # the current stretch starts at the stream's origin
    _grid: tuple[int, int] | None = None  # (boundary, period) of the grid before a pattern change
    _marker: npt.NDArray[np.int64] | None = None  # a collective once per iteration before the change
    _resume: int | None = None  # first unreported boundary before a restart (continue there if unchanged)
    _mark_end: bool = True  # mark iterations by the end of their last call (else the start of the first)
    _shown: int | None = None  # the period reported: the last one locked in, kept while re-estimating
    _out: tuple[list[float], list[float]] | None = field(default=None, repr=False)
    _window_from: int | None = field(default=None, repr=False)  # see PeriodVerdict.window_from

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
        sync: npt.ArrayLike | None = None,
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
                iteration passes before the first call (see `failslow.period.boundaries.mark_at_end`);
                otherwise between the mean start times of their calls.
            sync: Optional per-call flags: a collective over a group (not point-to-point). A period holding
                one of a kind that occurs once in it is not replaced by a multiple of itself
                (`failslow.period.symbols.marks_iteration`).

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
        self._window_from = None
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
        sy = np.zeros(len(t), dtype=bool) if sync is None else np.asarray(sync, dtype=bool).reshape(-1)
        if len(sy) != len(t):
            raise InputError("PeriodTracker.update: sync and t_start differ in length")
        self._sync = np.concatenate((self._sync, sy))
        if len(self._t) > self.buffer:
            drop = len(self._t) - self.buffer
            self._t, self._te, self._keys = self._t[drop:], self._te[drop:], self._keys[drop:]
            self._sync = self._sync[drop:]
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
                    if self._fraction_of_iteration(lo, lo + int(bad[0])):
                        # Not a new pattern: the period in force is a fraction of the iteration (see
                        # `_fraction_of_iteration`), and a restart would lock the same fraction in again on the
                        # next alike calls. The stretch grows until the whole iteration repeats; the period in
                        # force is not shown meanwhile.
                        self._shown_conf = min(self._shown_conf, 0.5 * CONFIDENCE_MIN)
                    else:
                        changed |= self._restart(lo + int(bad[0]))
        if self._shown is not None and self._shown_conf >= CONFIDENCE_MIN and self._recent \
                and self._end() - self._seg <= DOUBT_MAX_CALLS:
            # A gap far longer than the iterations shown, in a young stretch: maybe the first gap between the
            # real iterations (the period shown a fraction of them). Not stated until the next estimate.
            lo = max(new_start - 1, self._base) - self._base
            if len(self._t) - lo >= 2 and float(np.max(np.diff(self._t[lo:]))) > \
                    DOUBT_FACTOR * float(np.median(self._recent)):
                self._shown_conf = 0.5 * CONFIDENCE_MIN * self._shown_conf
        if self._grid is not None and self._period is None:
            self._interlude()
        if self._period is not None and self._end() - self._last_quick >= 2 * self._period:
            changed |= self._quick_check()
        for _ in range(3):  # estimate, emit; a change seen while emitting re-estimates the rest
            # Re-estimate on a schedule, and whenever the stretch has doubled since the last estimate:
            # a young stream's first answer (few repeats) may be a micro-batch, not the iteration.
            grown = self._end() - self._seg >= 2 * self._est_len and self._est_len < self.buffer
            pending = self._cand is not None and self._cand != self._period  # a lock-in to confirm
            # The period in force shown without confidence (an estimate over a stretch holding two paces):
            # estimated again every few iterations, so the latest ones can vouch for it (the rule in
            # `_estimate`) as soon as they are regular, not when the stretch has doubled (a one-call period
            # at 1.8 s per iteration hid a DP4 job's gauges for 150 s after a CPU fault).
            doubt = self._period is not None and self._shown == self._period \
                and self._shown_conf < CONFIDENCE_MIN and self._since_est >= 2 * self.min_repeats * self._period
            if (self._period is None or self._since_est >= self.refresh or grown or pending or doubt) \
                    and self._end() >= self._next_try:
                changed |= self._estimate()
            if self._period is None:
                break
            self._changed_by_gaps = False
            self._emit()
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
        self._window_from = None
        changed = False
        if self._cand is not None and self._cand != self._period:
            changed = self._estimate(trusted=True)
            if self._period is not None:
                self._emit()
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
        if est is not None and self._pinned(est.period, p):
            est = None
        if est is not None and est.period != p and est.period % p == 0:
            # a multiple is judged by the block test over MULTIPLE_REPEATS of its repeats (see trust_switch)
            lo = max(self._seg, self._end() - MULTIPLE_REPEATS * est.period) - self._base
        if est is None or est.period == p or not trust_switch(self._t[lo:], est.period, p):
            self._suspect = None
            return False
        if self._suspect != est.period:
            self._suspect = est.period
            return False
        self._suspect = None
        self._restart(self._end() - n)
        self._estimate()
        return True

    def _fraction_of_iteration(self, lo: int, first_bad: int) -> bool:
        """Whether the period in force is a fraction of the iteration: the stream makes a collective every S calls
        (the last three S apart, S longer than the period, the latest among the calls checked now) and the
        period holds none. A stage of many alike micro-batches (a Send/Recv pair each) otherwise locks in one
        micro-batch: each iteration's gradient all-reduce breaks the pattern, the stretch restarts after it and
        the next micro-batches lock it in again, so the stretch never holds the repeats the whole iteration
        needs. Once found, it holds while the collectives keep coming (within 2 S calls), until a period is
        locked in or the stretch restarts. A one-off collective (a barrier) is no evidence.
        """
        p = self._period
        if p is None:
            return False
        idx = np.flatnonzero(self._sync) + self._base
        if self._partial:
            if len(idx) and self._end() - int(idx[-1]) <= 2 * self._partial:
                return True
            self._partial = 0
            return False
        if len(idx) < 3 or int(idx[-1]) < lo:
            return False
        gaps = np.diff(idx[-3:])
        spacing = int(gaps[-1])
        before = first_bad - self._base
        if not (gaps == spacing).all() or spacing <= p or before < p or self._sync[before - p:before].any():
            return False
        self._partial = spacing
        return True

    def _restart(self, at: int, *, grid: bool = True) -> bool:
        """Start a new stationary stretch at call ``at`` (absolute); returns whether a period was lost.

        With ``grid`` (a pattern change, not lost records) and a period in force, the stretch starts on
        the boundary of the current grid at or before ``at``: a schedule changes between iterations, so
        the first new iteration began there. Complete iterations before it are reported first.
        """
        was = self._period is not None
        self._grid, self._resume, self._marker = None, None, None
        p, b = self._period, self._last_b
        if grid and p is not None and b is not None:
            snapped = b + ((at - b) // p) * p
            if snapped >= self._base:
                if self._out is not None:
                    # Complete old iterations are reported, except the one right before the change: it
                    # may be the first part of a longer new iteration (see `boundaries.phase_anchor`).
                    self._emit(limit=snapped - p)
                at = snapped
                self._grid = (snapped, p)
                self._resume = self._last_b
                lo = snapped - p - self._base
                if lo >= 0 and self._keys.shape[1]:
                    self._marker = iteration_marker(self._keys[lo:lo + p], self._sync[lo:lo + p])
        self._seg = max(at, self._base)
        self._seg_origin = False
        self._period, self._conf, self._last_b, self._next_try = None, 0.0, None, 0
        self._cand, self._partial = None, 0
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
        if self._period is not None and self._pinned(p, self._period):
            self._cand = self._period
            return False
        if self._grid is not None and p != self._grid[1] and not keeps_marker(self._keys[lo:], self._marker, p) \
                and self._recent and t[-1] - t[0] < LOCK_REPEATS * float(np.median(self._recent)):
            # The period before the change held the gradient synchronisation once; the job's iterations
            # still do (a new micro-batch count keeps it), every p calls over the whole stretch. Another
            # period is an interlude's (a validation's pings, read with the iterations after them) or a
            # multiple of the iteration (two all-reduces in it): not adopted, unless it outlasts 16 of the
            # old iterations (a job that really changed its synchronisation).
            self._cand = p
            self._next_try = self._end() + max(p, len(t) // 3)
            return False
        if p == self._shown and p == self._period and self._partial:
            pass  # a fraction of the iteration (`_fraction_of_iteration`): its own repeats do not vouch for it
        elif p == self._shown:
            if p == self._period:  # not while a change is re-estimated on a short stretch
                self._shown_conf = est.confidence
                if est.confidence < CONFIDENCE_MIN and len(t) > 4 * self.min_repeats * p:
                    # Iterations that slowed 3x within the stretch read as irregular though each pace is
                    # regular (a DP-only job under a CPU quota lost its gauges for 2,048 iterations): the
                    # period in force is as sure as its latest iterations say, unless the stretch holds a
                    # gap far longer than they are (the period is then a fraction of the iteration).
                    k = 4 * self.min_repeats * p
                    late = estimate_period(t[-k:], None if sym is None else sym[-k:], min_repeats=self.min_repeats)
                    if late is not None and late.period == p and len(late.iteration_s) and len(est.iteration_s) \
                            and est.iteration_s.max() <= DOUBT_FACTOR * float(np.median(late.iteration_s)):
                        self._shown_conf = max(est.confidence, late.confidence)
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
        if self._grid is not None and p != self._grid[1] and not trusted:
            # After a pattern change, the collective that marked the old iterations once (the gradient
            # synchronisation) marks every p calls since the change: p is the new iteration, adopted after
            # min_repeats of them (a split to one micro-batch, 9 -> 3 calls, would wait ~45 iterations for the
            # lock-in's 96 calls).
            trusted = marker_every(self._keys[lo:], self._marker, p, repeats=self.min_repeats, lead=self._grid[1])
        if self._grid is not None and p == self._grid[1]:
            # After a change alarm, the period in force before it is taken back at once (a false alarm:
            # one slow iteration, the job's closing barrier) if the iterations after the alarm look like
            # the old template again; a doubled count of alike micro-batches also first shows the old period.
            after = np.arange(self._seg + 3 * p, self._end() - p + 1, p, dtype=np.int64)
            trusted |= len(after) >= 2 and not self._iteration_bad(after, p).any()
        enough, trusted = lock_in(t, sym, p, old=None if self._grid is None else self._grid[1], cand=self._cand,
                                  trusted=trusted, min_repeats=self.min_repeats)
        if not (trusted or (enough and p == self._cand)):
            self._cand = p
            self._next_try = self._end() + max(p, len(t) // 3)
            return False
        self._cand = p
        if self._shown is not None and self._shown != p and self._shown_conf < CONFIDENCE_MIN:
            self._recent.clear()  # iterations of a period not trusted must not enter the new one's mean
            self._window_from = 0 if self._out is None else len(self._out[0])
        self._period, self._conf, self._shown, self._shown_conf = p, est.confidence, p, est.confidence
        self._partial = 0
        anchor = self._phase_anchor(p, est, sym)
        # Never report an iteration twice, nor one that left the buffer. On an unchanged grid this
        # lands exactly on the first unreported boundary: reporting goes on without a gap.
        floor = max([self._base] + [b for b in (self._last_b, self._resume) if b is not None])
        if anchor < floor:
            anchor += -(-(floor - anchor) // p) * p
        self._anchor = anchor
        self._last_b = anchor
        self._mark_end = mark_at_end(self._t, self._te, self._base, self._seg, self._anchor, self._period)
        self._fit_template()
        return True

    def _interlude(self) -> None:
        """After a change alarm: the old iteration's calls came back after calls of another pattern (see
        `failslow.period.interlude`). The old period goes on, on a grid that starts where they came back;
        the interlude is reported inside the iteration it interrupted (or the one before it, when it came
        between two), whose time it took."""
        assert self._grid is not None
        s, p = self._grid
        found = None if self._shown != p or self._resume is None else \
            resumed_grid(self._keys, self._base, s, p, self._resume)
        if found is None:
            return
        b, g = found
        self._period, self._conf, self._cand = p, self._shown_conf, p
        self._grid, self._resume, self._marker = None, None, None
        self._seg, self._anchor, self._next_try, self._since_est = g, g, 0, 0
        self._est_len = LOCK_REPEATS * p  # the next full estimate once the stretch holds twice that
        self._last_b = g
        self._report(b)

    def _pinned(self, new: int, cur: int) -> bool:
        """Whether `new` is a multiple of `cur` that may not replace it: the latest `cur` calls hold a
        once-per-period collective (see `marks_iteration`)."""
        return new != cur and new % cur == 0 and len(self._t) >= cur and self._keys.shape[1] > 0 \
            and marks_iteration(self._keys[-cur:], self._sync[-cur:])

    def _phase_anchor(self, p: int, est: PeriodEstimate, sym: IntArray | None) -> int:
        """Absolute index of a call that begins an iteration of period ``p`` in the current stretch."""
        return phase_anchor(self._t, self._base, self._seg, p, est.boundaries, sym,
                            from_origin=self._seg_origin and self.origin, grid=self._grid,
                            resume=self._resume, last_b=self._last_b)

    def _fit_template(self, upto: int | None = None) -> None:
        """Fit the gap template of the current period on the current stretch (iterations up to ``upto``)."""
        self._gaps.fit(self._t, self._base, self._seg, self._anchor, self._period, upto)

    def _iteration_bad(self, starts: IntArray, p: int | None = None) -> npt.NDArray[np.bool_]:
        """Which iterations of ``p`` calls (default: the current period) starting at ``starts`` do not
        look like the template (see `GapTemplate.bad`)."""
        return self._gaps.bad(self._t, self._base, starts, self._period if p is None else p)

    def _emit(self, *, limit: int | None = None) -> None:
        """Report the iterations completed since the last report (those ending at or before ``limit``).

        Iteration ``k`` runs from boundary ``B[k]`` to ``B[k+1]``; it is marked on one side of each
        boundary (see `failslow.period.boundaries.mark_at_end`), so reported durations telescope to the
        elapsed time.
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
        self._report(b)
        if restart_at is not None:
            self._restart(restart_at)
            self._changed_by_gaps = True

    def _report(self, b: IntArray) -> None:
        """Report the iterations between the boundaries ``b`` (absolute) of the current period."""
        assert self._period is not None and self._out is not None
        b, c = iteration_marks(self._t, self._te, self._base, b, self._period, self._mark_end)
        if c is not None:
            d = np.diff(c)
            self._out[0].extend(float(x) for x in d)
            self._out[1].extend(float(x) for x in c[1:])
            self._recent.extend(float(x) for x in d)
            self._total += len(d)
            self._last_end = float(c[-1])
            self._last_b = int(b[-1])

    def _verdict(self, changed: bool, s: list[float], t: list[float]) -> PeriodVerdict:
        return PeriodVerdict(
            period=self._shown, changed=changed,
            iteration_s=np.asarray(s, dtype=np.float64), iteration_end_t=np.asarray(t, dtype=np.float64),
            iterations_total=self._total,
            mean_iteration_s=float(np.mean(self._recent)) if self._recent else None,
            last_iteration_end_t=self._last_end, confidence=self._shown_conf if self._shown is not None else 0.0,
            window_from=self._window_from)
