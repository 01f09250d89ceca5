"""The service's engine reads speed-ups as the single-series path does (see tests/detect/test_speedups.py).

A short speed-up that ends (the job back at the level it ran at) opens no job event; a lasting one is the
new normal, and a slowdown from it opens (and closes) the job's event at the polls ``detect_series`` confirms.
"""

from __future__ import annotations

import numpy as np

from detector.engine import Engine
from detector.settings import Settings
from failslow.detect import detect_series

N = 320


def _events(engine: Engine, polls: np.ndarray, jobs: list[str], ranks: int) -> dict[str, list[tuple[str, int]]]:
    """Feed ``polls`` (time x series, ``ranks`` consecutive series per job); (what, poll) per job change."""
    seen: dict[str, list[tuple[str, int]]] = {j: [] for j in jobs}
    for t, row in enumerate(polls):
        samples = {(j, str(r)): float(row[k * ranks + r]) for k, j in enumerate(jobs) for r in range(ranks)}
        for ch in engine.step(float(t), samples, sample_ts=float(t)):
            if ch.what in ("opened", "closed"):
                seen[ch.event.job].append((ch.what, t))
    return seen


def _engine() -> Engine:
    s = Settings()
    return Engine(s.method, s.threshold, s.quorum, s.dtype)


def test_engine_agrees_with_the_single_series_path_on_speedups() -> None:
    """One job per case in one vectorised engine (default settings, float32): short speed-ups of 3-12 samples
    at 0.7x and 0.5x open nothing; a lasting 0.7x speed-up followed by 1.5x of that level opens and closes
    the job's event at the polls where ``detect_series`` (float64, batch form) confirms the slowdown and its
    end."""
    rng = np.random.default_rng(21)
    xs, short = [], []
    for length in range(3, 13):
        for factor in (0.7, 0.5):
            for noise in (0.01, 0.03):
                x = 1.0 + noise * rng.standard_normal(N)
                x[100:100 + length] *= factor
                xs.append(x)
                short.append(True)
    for factor in (0.7, 0.5):
        x = 1.0 + 0.01 * rng.standard_normal(N)
        x[100:] *= factor
        x[200:260] *= 1.5
        xs.append(x)
        short.append(False)
    jobs = [f"job{k}" for k in range(len(xs))]
    seen = _events(_engine(), np.stack(xs, axis=1), jobs, 1)
    for job, x, is_short in zip(jobs, xs, short, strict=True):
        res = detect_series(x, "bocd-v")
        at = {c.index: c.detected_at for c in res.change_points}
        want = [(w, t) for _, opened, end in res.events for w, t in (("opened", opened), ("closed", at.get(end, -1)))]
        assert seen[job] == want, (job, seen[job], want)
        if is_short:
            assert want == []
        else:
            assert [(e[0], e[2]) for e in res.events] == [(200, 260)]


def test_a_job_of_several_ranks_ignores_a_short_speedup_and_sees_the_slowdown_after_a_lasting_one() -> None:
    """Four ranks: an 8-sample 0.6x speed-up and back opens nothing; later the job gets faster for good
    (0.6x from 150) and 1.5x of that from 250 on opens one event there."""
    rng = np.random.default_rng(22)
    base = np.ones(N)
    base[60:68] *= 0.6
    base[150:] *= 0.6
    base[250:] *= 1.5
    polls = np.stack([base * (1.0 + 0.01 * rng.standard_normal(N)) for _ in range(4)], axis=1)
    seen = _events(_engine(), polls, ["train"], 4)["train"]
    assert [w for w, _ in seen] == ["opened"]
    assert 250 <= seen[0][1] <= 250 + 5
