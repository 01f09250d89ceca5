"""Scoring detectors on labelled jobs, per job as in FALCON's Tables 4–5, plus detection delay.

What it is for: one table that says how BOCD+V, plain BOCD and the sliding window do on the same jobs.

A method *alarms* when it opens a fail-slow event (see :class:`failslow.detect.EventTracker`). An alarm
*matches* a ground-truth fail-slow when its onset lies within ``margin`` iterations of that event's span.
Per job:

* a job with a fail-slow is a true positive when some alarm matches one of its fail-slows, else a false
  negative; a job without one (healthy, sub-10 % degradation, drift) is a false positive when it alarms
  at all, else a true negative;
* a job counts as *correct* for the accuracy only if it is a true positive with no unmatched (spurious)
  alarm, or a true negative. This is stricter than a per-job yes/no.

Delay is ``detected_at - onset`` of the first matched event, in iterations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from failslow.detect.registry import detect_matrix
from failslow.detect.synthetic import SyntheticJob
from failslow.errors import InputError


@dataclass(frozen=True)
class JobScore:
    """The outcome of one method on one job."""

    scenario: str
    truth: bool
    alarmed: bool
    detected: bool
    spurious: int
    delay: int | None

    @property
    def correct(self) -> bool:
        """True positive with no spurious alarm, or true negative."""
        return (self.detected and self.spurious == 0) if self.truth else not self.alarmed


@dataclass
class MethodScore:
    """Aggregate scores of one method over a set of jobs."""

    method: str
    jobs: list[JobScore] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Fraction of jobs judged correctly (strict, see module docstring)."""
        return float(np.mean([j.correct for j in self.jobs])) if self.jobs else float("nan")

    @property
    def fpr(self) -> float:
        """Fraction of jobs without a fail-slow that alarmed."""
        neg = [j for j in self.jobs if not j.truth]
        return float(np.mean([j.alarmed for j in neg])) if neg else float("nan")

    @property
    def fnr(self) -> float:
        """Fraction of jobs with a fail-slow where no alarm matched one."""
        pos = [j for j in self.jobs if j.truth]
        return float(np.mean([not j.detected for j in pos])) if pos else float("nan")

    @property
    def delays(self) -> list[int]:
        """Detection delays (iterations) of the detected jobs."""
        return [j.delay for j in self.jobs if j.delay is not None]

    @property
    def median_delay(self) -> float:
        """Median detection delay in iterations (NaN when nothing was detected)."""
        d = self.delays
        return float(np.median(d)) if d else float("nan")

    @property
    def p90_delay(self) -> float:
        """90th percentile of the detection delay."""
        d = self.delays
        return float(np.percentile(d, 90)) if d else float("nan")

    @property
    def spurious(self) -> int:
        """Alarms that matched no fail-slow, over all jobs."""
        return sum(j.spurious for j in self.jobs)


def score_job(job: SyntheticJob, alarms: Iterable[tuple[int, int, int]], margin: int = 10) -> JobScore:
    """Score one job given a method's alarms ``(onset, detected_at, end)``."""
    truth = job.failslow_events
    detected = False
    delay: int | None = None
    spurious = 0
    alarmed = False
    for onset, detected_at, _end in alarms:
        alarmed = True
        hit = next((e for e in truth if e.onset - margin <= onset <= e.end + margin), None)
        if hit is None:
            spurious += 1
            continue
        if not detected:
            detected = True
            delay = int(detected_at - hit.onset)
    return JobScore(scenario=job.scenario, truth=bool(truth), alarmed=alarmed, detected=detected,
                    spurious=spurious, delay=delay)


def score_method(jobs: Sequence[SyntheticJob], method: str, margin: int = 10) -> MethodScore:
    """Run ``method`` over all jobs at once (one vectorised detector, one series per job) and score it."""
    if not jobs:
        raise InputError("no jobs to score")
    n = {j.values.shape[0] for j in jobs}
    out = MethodScore(method)
    if len(n) == 1:
        results = detect_matrix(np.stack([j.values for j in jobs], axis=1), method)
    else:
        results = [detect_matrix(j.values[:, None], method)[0] for j in jobs]
    for job, res in zip(jobs, results, strict=True):
        out.jobs.append(score_job(job, res.events, margin))
    return out


def evaluate(jobs: Sequence[SyntheticJob], methods: Sequence[str] = ("bocd-v", "bocd", "window"),
             margin: int = 10) -> list[MethodScore]:
    """Score several methods on the same jobs."""
    return [score_method(jobs, m, margin) for m in methods]


def markdown_table(scores: Sequence[MethodScore]) -> str:
    """The comparison table: accuracy, FPR, FNR, delays and spurious alarms per method."""
    lines = ["| method | jobs | accuracy | FPR | FNR | median delay (it) | p90 delay (it) | spurious alarms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scores:
        lines.append(f"| {s.method} | {len(s.jobs)} | {s.accuracy:.1%} | {s.fpr:.1%} | {s.fnr:.1%} | "
                     f"{s.median_delay:.1f} | {s.p90_delay:.1f} | {s.spurious} |")
    return "\n".join(lines)


def per_scenario_table(score: MethodScore) -> str:
    """Accuracy and detection of one method broken down by scenario."""
    lines = [f"| scenario ({score.method}) | jobs | correct | alarmed | detected | median delay |",
             "|---|---:|---:|---:|---:|---:|"]
    for sc in sorted({j.scenario for j in score.jobs}):
        js = [j for j in score.jobs if j.scenario == sc]
        d = [j.delay for j in js if j.delay is not None]
        med = f"{np.median(d):.1f}" if d else "-"
        lines.append(f"| {sc} | {len(js)} | {sum(j.correct for j in js)} | {sum(j.alarmed for j in js)} | "
                     f"{sum(j.detected for j in js)} | {med} |")
    return "\n".join(lines)
