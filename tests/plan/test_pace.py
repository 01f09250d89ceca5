"""The pace model: calibrated on per-rank compute times, it predicts what a micro-batch split does."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.plan.microbatch import rebalance
from failslow.plan.pace import RankCompute, fit, healthy_stages, healthy_step, overhead, slow_ranks


def _ranks(per_mb: np.ndarray, counts: list[int], tp: int = 1) -> list[RankCompute]:
    out, r = [], 0
    for d in range(per_mb.shape[0]):
        for s in range(per_mb.shape[1]):
            for k in range(tp):  # TP ranks of a stage: the slowest counts
                out.append(RankCompute(r, d, s, per_mb[d, s] * counts[d] * (1.0 - 0.01 * k)))
                r += 1
    return out


def test_calibration_reproduces_the_measured_iteration_and_the_pipeline_formula() -> None:
    per_mb = np.array([[0.10, 0.12], [0.30, 0.12]])  # replica 1's stage 0 is slow
    counts = [4, 4]
    overhead = 0.07
    replica = [(m - 1) * per_mb[d].max() + per_mb[d].sum() for d, m in enumerate(counts)]
    T = overhead + max(replica)
    m = fit(_ranks(per_mb, counts, tp=2), counts, T)
    assert np.allclose(m.per_mb, per_mb)
    assert m.overhead_s == pytest.approx(overhead)
    assert m.predict(counts) == pytest.approx(T)
    assert np.allclose(m.times, [0.12, 0.30]) and np.allclose(m.offsets, [0.10, 0.12])
    assert m.imbalance() == pytest.approx(replica[1] / replica[0])
    # what a split does: the slow replica's pipeline with 2 micro-batches, the fast one's with 6
    assert m.predict([6, 2]) == pytest.approx(overhead + max(5 * 0.12 + 0.22, 1 * 0.30 + 0.42))


def test_the_solver_and_the_model_agree_on_the_best_split() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        dp, pp = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        per_mb = rng.uniform(0.05, 0.2, (dp, pp))
        per_mb[rng.integers(dp), rng.integers(pp)] *= rng.uniform(1.5, 4.0)
        counts = [4] * dp
        m = fit(_ranks(per_mb, counts), counts, 5.0)
        best = rebalance(m.times, sum(counts), offsets=m.offsets)
        # no other split of the same total predicts a faster iteration (checked on every neighbour)
        for i in range(dp):
            for j in range(dp):
                c = list(best.counts)
                if i != j and c[i] > 1:
                    c[i] -= 1
                    c[j] += 1
                    assert m.predict(c) >= m.predict(best.counts) - 1e-12


def test_a_cell_without_a_reading_is_taken_from_its_stage_in_the_other_replicas() -> None:
    per_mb = np.array([[0.10, 0.12], [0.30, 0.12], [0.10, 0.14]])
    ranks = _ranks(per_mb, [4, 4, 4])
    ranks[3] = RankCompute(ranks[3].rank, 1, 1, 0.0)  # replica 1, stage 1: the exporter had nothing
    with pytest.raises(InputError, match="positive"):
        fit(ranks, [4, 4, 4], 2.0)
    m = fit(ranks, [4, 4, 4], 2.0, impute=True)
    assert m.per_mb[1, 1] == pytest.approx(0.13)  # the median of 0.12 and 0.14
    assert np.allclose(np.delete(m.per_mb.ravel(), 3), np.delete(per_mb.ravel(), 3))
    with pytest.raises(InputError, match="no compute time for replica 0, stage 1"):
        fit([RankCompute(0, 0, 0, 0.4), RankCompute(1, 0, 1, float("nan"))], [4], 1.0, impute=True)


def test_replicas_that_read_fast_while_waiting_are_priced_at_their_healthy_speed() -> None:
    # healthy: stage 0 takes 0.10 s per micro-batch, stage 1 0.12 s, in both replicas; F = 0.05 s
    healthy_mb = np.array([[0.10, 0.12], [0.10, 0.12]])
    counts = [8, 8]
    T0 = 0.05 + 7 * 0.12 + 0.22
    floor = healthy_stages(_ranks(healthy_mb, counts), counts)
    assert floor == pytest.approx((0.10, 0.12))
    f0 = overhead(_ranks(healthy_mb, counts), counts, T0)
    assert f0 == pytest.approx(0.05)
    # the fault: replica 1's stage 1 runs 2x slower; replica 0, waiting for it, reads 10% faster than healthy
    fault_mb = np.array([[0.09, 0.108], [0.10, 0.24]])
    T = 0.05 + 7 * 0.24 + 0.34
    raw = fit(_ranks(fault_mb, counts), counts, T, f0)
    held = fit(_ranks(fault_mb, counts), counts, T, f0, floor=floor)
    assert np.allclose(held.per_mb, [[0.10, 0.12], [0.10, 0.24]])
    assert held.predict(counts) == raw.predict(counts) == pytest.approx(T)  # the straggler paces both
    # the split the solver picks is priced with replica 0 busy at its healthy speed
    best = rebalance(held.times, 16, offsets=held.offsets).counts
    assert list(best) == [11, 5]
    assert held.predict(best) == pytest.approx(0.05 + 10 * 0.12 + 0.22)
    # without the floor replica 0 would take 10 * 0.108 + 0.198 s and the straggler would pace the split: 8% too fast
    assert raw.predict(best) == pytest.approx(0.05 + 4 * 0.24 + 0.34)
    # a floor of another pipeline depth, or not finite, is refused
    for bad in ((0.1,), (0.1, float("nan")), (0.1, -1.0)):
        with pytest.raises(InputError, match="per-stage floors"):
            fit(_ranks(fault_mb, counts), counts, T, f0, floor=bad)


def test_the_healthy_overhead_is_not_taken_from_a_replica_already_reading_the_fault() -> None:
    # healthy: four replicas at 0.06 s per micro-batch, 8 each, F = 0.04 s; the straggler's reading just before
    # the onset already holds a few slow iterations (0.07 s): F from the slowest replica would be 0
    counts = [8, 8, 8, 8]
    T0 = 0.04 + 8 * 0.06
    per_mb = np.array([[0.07], [0.06], [0.06], [0.06]])
    assert overhead(_ranks(per_mb, counts), counts, T0) == pytest.approx(0.04)
    assert fit(_ranks(per_mb, counts), counts, T0).overhead_s == pytest.approx(T0 - 8 * 0.07)


@pytest.mark.parametrize("ranks, counts, T, words", [
    ([], [4], 1.0, "no rank"),
    ([RankCompute(0, 0, 0, 1.0)], [4, 4], 1.0, "no compute time for replica 1"),
    ([RankCompute(0, 2, 0, 1.0)], [4, 4], 1.0, "outside"),
    ([RankCompute(0, 0, 0, -1.0)], [4], 1.0, "positive"),
    ([RankCompute(0, 0, 0, 1.0)], [0], 1.0, "counts"),
    ([RankCompute(0, 0, 0, 1.0)], [4], float("nan"), "iteration time"),
])
def test_bad_input_is_refused(ranks, counts, T, words) -> None:
    with pytest.raises(InputError, match=words):
        fit(ranks, counts, T)


def test_a_straggler_hidden_behind_a_slower_one_shows_in_its_own_compute() -> None:
    """DP2xPP3 as a consolidation run read it (4 micro-batches per replica): rank 1 (replica 1, stage 0) at
    0.180 s per micro-batch paces replica 1, so rank 5 (replica 1, stage 2) at 0.094 s changes no pace the
    detector sees; against stage 2's healthy 0.045 s it is 2.1x. The other cells, waiting for rank 1, read
    at or under their healthy time."""
    healthy = [0.080, 0.041, 0.045]
    per_mb = {0: 0.079, 1: 0.180, 2: 0.040, 3: 0.041, 4: 0.044, 5: 0.094}
    ranks = [RankCompute(r, r % 2, r // 2, 4 * t) for r, t in per_mb.items()]
    assert slow_ranks(ranks, [4, 4], healthy) == (1, 5)
    assert slow_ranks(ranks, [4, 4], healthy, multiple=2.5) == ()
    # per micro-batch: the same compute over twice the micro-batches is not slow
    assert slow_ranks(ranks, [8, 8], healthy) == ()
    # a stage the floor does not cover, or a floor of 0, judges nobody
    assert slow_ranks(ranks, [4, 4], healthy[:2]) == (1,)
    assert slow_ranks(ranks, [4, 4], [0.0, 0.0, 0.0]) == ()


def test_work_outside_the_pipeline_is_priced_once_per_iteration() -> None:
    """Ranks that report their compute outside the pipeline (optimizer step w per iteration; a first stage's
    reading also holds one micro-batch): the cells come out per micro-batch without it, the replica carries
    its slowest stage's step once, and a split that takes micro-batches from the slow replica leaves its step
    whole. Priced per micro-batch (no reading), [5, 3] takes a quarter of the slow replica's step away with its
    micro-batch and is predicted too fast by it."""
    per_mb = np.array([[0.10, 0.12], [0.20, 0.12]])  # replica 1's stage 0 is slow: its step too
    w = np.array([[0.05, 0.05], [0.10, 0.05]])
    counts, F = [4, 4], 0.03
    ranks, r = [], 0
    for d in range(2):
        for s in range(2):
            c = counts[d] * per_mb[d, s] + w[d, s]
            u = w[d, s] + (per_mb[d, s] if s == 0 else 0.0)  # the first stage's stretch holds one micro-batch
            ranks.append(RankCompute(r, d, s, c, outside_s=u))
            r += 1
    replica = [counts[d] * per_mb[d].max() + per_mb[d].sum() - per_mb[d].max() + w[d].max() for d in range(2)]
    T = F + max(replica)
    m = fit(ranks, counts, T)
    assert np.allclose(m.per_mb, per_mb) and m.step is not None and np.allclose(m.step, w)
    assert m.overhead_s == pytest.approx(F)
    assert np.allclose(m.offsets, [0.10 + 0.05, 0.12 + 0.10])
    truth = F + max(5 * 0.12 + 0.22 + 0.05, 1 * 0.20 + 0.32 + 0.10)  # (m - 1) * t + sum + w
    assert m.predict([6, 2]) == pytest.approx(truth)
    spread = fit([RankCompute(x.rank, x.dp, x.pp, x.compute_s) for x in ranks], counts, T)
    five_three = F + max(4 * 0.12 + 0.22 + 0.05, 2 * 0.20 + 0.32 + 0.10)
    assert m.predict([5, 3]) == pytest.approx(five_three)
    assert spread.step is None and spread.predict([5, 3]) == pytest.approx(five_three - 0.10 / 4)
    # the split the solver picks with the step priced once is the model's best
    best = rebalance(m.times, 8, 1, offsets=m.offsets)
    assert m.predict(best.counts) == pytest.approx(min(m.predict([k, 8 - k]) for k in range(1, 8)))


@pytest.mark.parametrize("u", [None, 0.0, -0.1, float("nan"), 0.9])
def test_an_unusable_outside_reading_leaves_all_compute_per_micro_batch(u: float | None) -> None:
    """No reading, none, negative, not a number, or as large as the compute itself: the rank is priced as before."""
    ranks = [RankCompute(0, 0, 0, 0.8, u), RankCompute(1, 0, 1, 0.8, u)]
    m = fit(ranks, [4], 1.0)
    assert m.step is None and np.allclose(m.per_mb, [[0.2, 0.2]])


def test_the_healthy_step_and_the_floor_come_without_the_step() -> None:
    """The healthy calibration with steps told: each stage's floor is its time per micro-batch without the step,
    the healthy step is the median replica's slowest stage's, and F is what is left of the pace."""
    counts = [4, 4]
    ranks = [RankCompute(0, 0, 0, 4 * 0.10 + 0.04, 0.04 + 0.10), RankCompute(1, 1, 0, 4 * 0.10 + 0.06, 0.06 + 0.10),
             RankCompute(2, 0, 1, 4 * 0.05 + 0.04, 0.04), RankCompute(3, 1, 1, 4 * 0.05 + 0.04, 0.04)]
    assert healthy_stages(ranks, counts) == pytest.approx((0.10, 0.05))
    assert healthy_step(ranks, counts) == pytest.approx(0.05)  # replicas' steps 0.04 and 0.06
    pace = 0.02 + 3 * 0.10 + 0.15 + 0.05  # F + the median replica
    assert overhead(ranks, counts, pace) == pytest.approx(0.02)
    # judged against that floor, a rank is slow per micro-batch without its step
    slowed = [*ranks[:3], RankCompute(3, 1, 1, 4 * 0.08 + 0.04, 0.04)]
    assert slow_ranks(slowed, counts, healthy_stages(ranks, counts)) == (3,)  # 0.08 / 0.05 = 1.6x
    # a first stage with one micro-batch cannot tell its step from the micro-batch in its stretch
    one = fit([RankCompute(0, 0, 0, 0.3, 0.3 - 1e-9), RankCompute(1, 0, 1, 0.2, 0.05)], [1], 1.0)
    assert one.per_mb[0, 0] == pytest.approx(0.3) and one.step is not None and one.step[0, 0] == 0.0
