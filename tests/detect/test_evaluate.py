"""Scoring of detectors on labelled jobs (FALCON Tables 4–5 style): the table, a job's delay, spurious alarms."""

from __future__ import annotations

from failslow.detect.evaluate import evaluate, score_job
from failslow.detect.synthetic import generate_job


def test_evaluation_table_and_scoring() -> None:
    jobs = [generate_job(s, sc, n=800) for s, sc in enumerate(["healthy", "compute", "sub10", "ladder"])]
    scores = evaluate(jobs)
    assert [s.method for s in scores] == ["bocd-v", "bocd", "window"]
    assert scores[0].accuracy == 1.0 and scores[0].fpr == 0.0 and scores[0].fnr == 0.0
    job = jobs[1]
    ev = job.events[0]
    assert score_job(job, [(ev.onset, ev.onset + 4, -1)]).delay == 4
    assert score_job(job, [(5, 9, 20)]).spurious == 1
    assert not score_job(job, []).detected
