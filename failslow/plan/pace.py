"""A job's pace from its per-rank compute times, and the iteration time an action would leave it with.

The planner only acts when a prediction says the action pays off, so it needs a model of the iteration time
that the measured series can calibrate and that an action changes in a known way. For a DP×PP(×TP) job
running 1F1B (or GPipe) pipelines:

* each rank reports its compute time per iteration ``c_r`` (time outside communication calls; the exporter's
  ``failslow_iteration_compute_seconds``) while its DP replica ``d`` runs ``m_d`` micro-batches, so stage
  ``s`` of replica ``d`` spends ``tau[d, s] = max over its TP ranks of c_r / m_d`` per micro-batch;
* where the exporter also tells the rank's compute outside the pipeline ``u_r``
  (``failslow_iteration_outside_pipeline_compute_seconds``: optimizer step and host work, once per
  iteration; on a first stage also one micro-batch's forward and backward), that part is not priced per
  micro-batch: ``tau[d, s] = (c_r - u_r) / m_d`` and ``w[d, s] = u_r`` (first stage: ``(c_r - u_r) / (m_d - 1)``
  and ``u_r - tau``), and the replica's once-per-iteration work is ``w_d = max_s w[d, s]`` (every stage
  steps after the all-reduce; the slowest holds the next pipeline back). Without it ``w = 0`` and the work
  is spread over the micro-batches, as it is in ``c_r``;
* a pipeline of ``m`` micro-batches takes ``(m - 1) * max_s tau[d, s] + sum_s tau[d, s]`` (the bottleneck
  stage paces the steady state, every stage is passed once while filling and draining): with
  ``t_d = max_s tau[d, s]`` and ``o_d = sum_s tau[d, s] - t_d + w_d`` replica ``d`` takes ``m_d * t_d + o_d``;
* every replica waits for the slowest at the gradient all-reduce, so the iteration takes
  ``T = F + max_d (m_d * t_d + o_d)`` where ``F`` (all-reduce; optimizer and host work where ``w`` does not
  hold them) is what the measured iteration time ``T`` leaves over. ``F`` is calibrated now and held constant
  across an action.
* a replica that waits for a straggler reads faster per micro-batch than it runs once an action keeps it busy
  (on the testbed's CPU-quota devices a process that idles between bursts starts each burst with the
  period's quota unspent, and the host's other work has the idle time). So each cell can be floored at its
  stage's time on the healthy job (:func:`healthy_stages`): the ranks the fault left alone are priced at
  their healthy speed, not faster.

A micro-batch split changes only the ``m_d``; the exact split that minimises the slowest replica is
:func:`failslow.plan.microbatch.rebalance` on ``(t_d, o_d)``. The model is deliberately the one the S2
solver optimises, so that the prediction and the plan cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RankCompute:
    """One rank's measured compute time per iteration and its place in the job.

    Attributes:
        rank: Global rank.
        dp: Data-parallel replica.
        pp: Pipeline stage.
        compute_s: Time per iteration outside communication calls (seconds).
        outside_s: The part of `compute_s` outside the pipeline (see the module docstring); None: not known.
    """

    rank: int
    dp: int
    pp: int
    compute_s: float
    outside_s: float | None = None


@dataclass(frozen=True)
class PaceModel:
    """The calibrated iteration-time model of one job (see the module docstring).

    Attributes:
        per_mb: ``tau[d, s]``, seconds per micro-batch of stage ``s`` in replica ``d``.
        microbatches: ``m_d`` the job ran with when ``per_mb`` was measured.
        iteration_s: The measured iteration time ``T``.
        overhead_s: ``F``: the part of ``T`` outside the slowest replica's pipeline (negative when the
            model over-estimates the pipeline, e.g. where compute overlaps communication; predictions are
            then still the measured ``T`` plus the change in the slowest replica).
        step: ``w[d, s]``, seconds of once-per-iteration work of stage ``s`` in replica ``d`` (None: none known,
            all of it is in `per_mb`).
    """

    per_mb: FloatArray
    microbatches: tuple[int, ...]
    iteration_s: float
    overhead_s: float
    step: FloatArray | None = None

    @property
    def times(self) -> FloatArray:
        """``t_d``: the bottleneck stage's time per micro-batch in each replica."""
        return np.asarray(self.per_mb.max(axis=1), dtype=np.float64)

    @property
    def offsets(self) -> FloatArray:
        """``o_d``: pipeline fill and drain of each replica (0 without pipeline parallelism) plus its
        once-per-iteration work ``w_d``."""
        w = np.zeros(self.per_mb.shape[0]) if self.step is None else self.step.max(axis=1)
        return np.asarray(self.per_mb.sum(axis=1) - self.per_mb.max(axis=1) + w, dtype=np.float64)

    def replica_s(self, counts: Sequence[int]) -> FloatArray:
        """Compute time of each replica with `counts` micro-batches."""
        m = _counts(counts, self.per_mb.shape[0])
        return np.asarray(m * self.times + self.offsets, dtype=np.float64)

    def predict(self, counts: Sequence[int]) -> float:
        """Iteration time the job would take with micro-batch split `counts` (at least 1% of today's)."""
        return max(0.01 * self.iteration_s, self.overhead_s + float(self.replica_s(counts).max()))

    def imbalance(self) -> float:
        """Slowest over fastest replica compute time as the job runs now (1 = balanced)."""
        r = self.replica_s(self.microbatches)
        return float(r.max() / r.min()) if r.min() > 0 else math.inf


def _counts(counts: Sequence[int], dp: int) -> FloatArray:
    m = np.asarray(list(counts), dtype=np.float64)
    if m.shape != (dp,) or not np.all(m >= 1) or not np.all(m == np.floor(m)):
        raise InputError(f"need {dp} micro-batch counts >= 1, got {list(counts)}")
    return m


def fit(ranks: Sequence[RankCompute], microbatches: Sequence[int], iteration_s: float,
        overhead_s: float | None = None, *, impute: bool = False,
        floor: Sequence[float] | None = None) -> PaceModel:
    """Calibrate the model on one job's measured ranks.

    Args:
        ranks: Every rank's compute time (several TP ranks of one stage: the slowest counts).
        microbatches: Micro-batches per DP replica the job ran with while measured.
        iteration_s: The job's measured iteration time.
        overhead_s: ``F`` measured elsewhere, typically on the healthy job before the onset (see
            :func:`overhead`); by default what ``iteration_s`` leaves over now. A straggler's compute
            carries its per-iteration work (optimizer step, host work) slowed too, which the per-micro-batch
            model books as pipeline time: ``F`` calibrated during the fault then comes out too small (even
            negative) and every other split is predicted too fast.
        impute: Take a replica/stage cell without a usable reading (missing, zero, not finite) as the same stage
            of the other replicas; without, such a cell is an error.
        floor: Seconds per micro-batch of each stage that no cell is taken below, typically the healthy job's
            (:func:`healthy_stages`): replicas that wait for a straggler read fast (see the module docstring).

    Raises:
        InputError: no ranks, a replica or stage with no rank (no other replica to take it from, with
            `impute`), coordinates outside the split, or times that are not positive and finite.
    """
    if not ranks:
        raise InputError("no rank compute times to model the job with")
    if not (iteration_s > 0 and math.isfinite(iteration_s)):
        raise InputError(f"iteration time must be positive, got {iteration_s}")
    dp = len(microbatches)
    m = _counts(microbatches, dp)
    pp = 1 + max(r.pp for r in ranks)
    per_mb = np.full((dp, pp), np.nan)
    step = np.zeros((dp, pp))
    for r in ranks:
        if not 0 <= r.dp < dp or r.pp < 0:
            raise InputError(f"rank {r.rank}: replica {r.dp} / stage {r.pp} outside a {dp}-replica split")
        if not (r.compute_s > 0 and math.isfinite(r.compute_s)):
            if impute:
                continue  # a reading the exporter did not have (a window without an iteration): filled below
            raise InputError(f"rank {r.rank}: compute time must be positive, got {r.compute_s}")
        t, w = split_rank(r, m[r.dp], pp)
        per_mb[r.dp, r.pp] = t if np.isnan(per_mb[r.dp, r.pp]) else max(per_mb[r.dp, r.pp], t)
        step[r.dp, r.pp] = max(step[r.dp, r.pp], w)
    missing = np.isnan(per_mb)
    if impute and missing.any():
        # A cell without a reading is taken as its stage in the other replicas (their median): it is not the
        # straggler as far as anything measured says, and one missing gauge must not stop every plan.
        known = (~missing).any(axis=0)
        stage = np.full(pp, np.nan)
        if known.any():
            stage[known] = np.nanmedian(per_mb[:, known], axis=0)
        per_mb = np.where(missing, stage[None, :], per_mb)
    if np.isnan(per_mb).any():
        d, s = np.argwhere(np.isnan(per_mb))[0]
        raise InputError(f"no compute time for replica {d}, stage {s}")
    if floor is not None:
        low = np.asarray(list(floor), dtype=np.float64)
        if low.shape != (pp,) or not np.all(np.isfinite(low)) or not np.all(low >= 0):
            raise InputError(f"need {pp} per-stage floors >= 0, got {list(floor)}")
        per_mb = np.maximum(per_mb, low[None, :])
    if overhead_s is not None and not (overhead_s >= 0 and math.isfinite(overhead_s)):
        raise InputError(f"overhead must be >= 0 and finite, got {overhead_s}")
    model = PaceModel(per_mb=per_mb, microbatches=tuple(int(x) for x in m), iteration_s=float(iteration_s),
                      overhead_s=0.0, step=step if step.any() else None)
    slowest = float(model.replica_s(model.microbatches).max())
    return replace(model, overhead_s=float(iteration_s) - slowest if overhead_s is None else float(overhead_s))


def split_rank(r: RankCompute, microbatches: float, stages: int) -> tuple[float, float]:
    """A rank's compute as (seconds per micro-batch, once-per-iteration seconds) with `microbatches` in its
    replica and `stages` pipeline stages (module docstring); without a usable ``outside_s`` all of it is per
    micro-batch. A first stage's stretch outside the pipeline holds one micro-batch too, so it needs two."""
    u = r.outside_s
    first = r.pp == 0
    if u is None or not (0 < u < r.compute_s) or stages < 2 or (first and microbatches < 2):
        return r.compute_s / microbatches, 0.0
    if not first:
        return (r.compute_s - u) / microbatches, u
    t = (r.compute_s - u) / (microbatches - 1)
    if t > u:  # the stretch is shorter than the micro-batch it holds: not the layout the split assumes
        return r.compute_s / microbatches, 0.0
    return t, u - t


def overhead(healthy_ranks: Sequence[RankCompute], microbatches: Sequence[int], healthy_s: float) -> float:
    """``F`` of the healthy job (before the onset): its iteration time less its median replica's pipeline,
    at least 0.

    The replicas of a healthy job run alike, so the median stands for all of them and is not lifted by one
    whose reading already holds the fault's first iterations (a reading is a mean over the exporter's window,
    and the detector's onset can trail the fault by seconds; ``F`` too small prices every split too fast).
    What the iteration loses waiting for whichever replica is slowest in
    each iteration stays in ``F``, where a balanced split meets it again.

    Raises:
        InputError: as :func:`fit`.
    """
    return healthy_calibration(healthy_ranks, microbatches, healthy_s)[0]


def healthy_stages(healthy_ranks: Sequence[RankCompute], microbatches: Sequence[int]) -> tuple[float, ...]:
    """Seconds per micro-batch of each pipeline stage on the healthy job (the median over its replicas): the
    floor :func:`fit` keeps a cell at while a straggler makes the other replicas wait.

    Raises:
        InputError: as :func:`fit`.
    """
    return healthy_calibration(healthy_ranks, microbatches, 1.0)[1]


def healthy_step(healthy_ranks: Sequence[RankCompute], microbatches: Sequence[int]) -> float:
    """The once-per-iteration work ``w_d`` of the healthy job's median replica (0 where the ranks do not tell
    their compute outside the pipeline): what :func:`overhead` leaves out of ``F`` because the model carries
    it with the replicas.

    Raises:
        InputError: as :func:`fit`.
    """
    return healthy_calibration(healthy_ranks, microbatches, 1.0)[2]


def healthy_calibration(healthy_ranks: Sequence[RankCompute], microbatches: Sequence[int], healthy_s: float
                        ) -> tuple[float, tuple[float, ...], float]:
    """:func:`overhead`, :func:`healthy_stages` and :func:`healthy_step` of one healthy reading, from one fit.

    Raises:
        InputError: as :func:`fit`.
    """
    model = fit(healthy_ranks, microbatches, healthy_s)
    f = max(0.0, healthy_s - float(np.median(model.replica_s(model.microbatches))))
    stages = tuple(float(x) for x in np.median(model.per_mb, axis=0))
    step = 0.0 if model.step is None else float(np.median(model.step.max(axis=1)))
    return f, stages, step


#: A rank computing this many times its stage's healthy time per micro-batch is slow whether or not the
#: detector named it. Healthy cells read about 1x (faster when they wait for a straggler, see the module
#: docstring); the testbed's weakest CPU fault reads 1.33x, so 1.5x is above every healthy reading and
#: below the faults that hide (the hidden rank of a DP2xPP3 consolidation run read 2.1x).
SLOW_CELL_MULTIPLE = 1.5


def slow_ranks(ranks: Sequence[RankCompute], microbatches: Sequence[int], floor: Sequence[float],
               multiple: float = SLOW_CELL_MULTIPLE) -> tuple[int, ...]:
    """Ranks whose compute per micro-batch is at least `multiple` times their stage's healthy time (`floor`,
    :func:`healthy_stages`), in rank order.

    Why: the detector names the ranks whose *iteration* pace changed against their peers; a straggler behind
    another, slower one in the same DP replica changes nothing the replica's pace shows, and goes unnamed
    until the first one is gone. Its own compute time shows it. A rank outside the split or of a stage the
    floor does not cover is left out (no reference to judge it by).
    """
    m = _counts(microbatches, len(microbatches))
    out = []
    for r in ranks:
        if not (0 <= r.dp < m.shape[0] and 0 <= r.pp < len(floor)) or not (floor[r.pp] > 0):
            continue
        per_mb = split_rank(r, m[r.dp], len(floor))[0]
        if math.isfinite(per_mb) and per_mb >= multiple * floor[r.pp]:
            out.append(r.rank)
    return tuple(sorted(out))
