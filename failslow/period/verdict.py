"""What one `failslow.period.tracker.PeriodTracker.update` reports."""

from __future__ import annotations

from dataclasses import dataclass

from failslow.period.numeric import FloatArray


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
        window_from: Where the window of `mean_iteration_s` restarted in this update: the index of the first of
            `iteration_s` it holds (those before it were iterations of a period never shown, such as one
            micro-batch taken for the iteration); ``None`` when it did not restart. A caller that keeps its own
            per-iteration window restarts it there too.
    """

    period: int | None
    changed: bool
    iteration_s: FloatArray
    iteration_end_t: FloatArray
    iterations_total: int
    mean_iteration_s: float | None
    last_iteration_end_t: float | None
    confidence: float
    window_from: int | None = None
