"""The service's engine opens and closes short slowdowns (3-12 samples) exactly when the single-series path does.

See tests/detect/test_short_slowdowns.py for the cause (an event that never closed after a slowdown of 5-7
samples), the shortest slowdown that is seen (``n_min`` = 5 samples always, 4 sometimes, 3 never) and the
bound on closing (the end confirmed at most ``n_min`` samples after the first healthy sample).
"""

from __future__ import annotations

import numpy as np

from detector.engine import Engine
from detector.settings import Settings
from failslow.detect import VerifyConfig, detect_series

ONSET = 100
N = 260
N_MIN = VerifyConfig().n_min


def _series(length: int, factor: float, noise: float, rng: np.random.Generator) -> np.ndarray:
    x = 1.0 + noise * rng.standard_normal(N)
    x[ONSET:ONSET + length] *= factor
    return x


def _events(engine: Engine, polls: np.ndarray, jobs: list[str], ranks: int) -> dict[str, list[tuple[str, int]]]:
    """Feed ``polls`` (time x series, ``ranks`` consecutive series per job); (what, poll) per job change."""
    seen: dict[str, list[tuple[str, int]]] = {j: [] for j in jobs}
    for t, row in enumerate(polls):
        samples = {(j, str(r)): float(row[k * ranks + r]) for k, j in enumerate(jobs) for r in range(ranks)}
        for ch in engine.step(float(t), samples, sample_ts=float(t)):
            if ch.what in ("opened", "closed"):
                seen[ch.event.job].append((ch.what, t))
    return seen


def test_engine_opens_and_closes_short_slowdowns_as_the_single_series_path() -> None:
    """One job per case, one rank each, all in one vectorised engine with the service's default settings
    (float32 state): each job's event opens and closes at the polls where ``detect_series`` (float64, batch
    form) confirms the slowdown and its end."""
    rng = np.random.default_rng(11)
    cases = [(n, f, noise) for n in range(3, 13) for f in (1.4, 2.0) for noise in (0.01, 0.03)]
    xs = [_series(n, f, noise, rng) for n, f, noise in cases]
    jobs = [f"job{k}" for k in range(len(cases))]
    s = Settings()
    seen = _events(Engine(s.method, s.threshold, s.quorum, s.dtype), np.stack(xs, axis=1), jobs, 1)
    for job, x, (n, _, _) in zip(jobs, xs, cases, strict=True):
        res = detect_series(x, "bocd-v")
        at = {c.index: c.detected_at for c in res.change_points}
        want = [(w, t) for _, opened, end in res.events for w, t in (("opened", opened), ("closed", at[end]))]
        assert seen[job] == want, (n, seen[job], want)
        if n >= N_MIN:
            assert len(want) == 2
        for (what, t) in seen[job][1::2]:
            assert what == "closed" and N_MIN - 1 <= t - (ONSET + n) <= N_MIN


def test_a_job_of_several_ranks_closes_a_short_slowdown() -> None:
    """A 6-sample 1.4x slowdown on every rank of a 4-rank job: one event, closed within the bound."""
    rng = np.random.default_rng(12)
    polls = np.stack([_series(6, 1.4, 0.01, rng) for _ in range(4)], axis=1)
    s = Settings()
    seen = _events(Engine(s.method, s.threshold, s.quorum, s.dtype), polls, ["train"], 4)["train"]
    assert [w for w, _ in seen] == ["opened", "closed"]
    assert seen[1][1] - (ONSET + 6) <= N_MIN
