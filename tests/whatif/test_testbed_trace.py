"""A recorded testbed trace (DP2 x PP2 on 2 shared cores, one rank CPU-capped at 0.24 CPUs: a run of the
bench's validation protocol): the estimate against the slowdown measured in the same run."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.whatif import analyze
from failslow.whatif.model import build_model
from failslow.whatif.trace import OPTYPE_CODE, select_steps


@pytest.fixture(scope="module")
def recorded(recorded_run) -> tuple[dict, object]:
    return recorded_run("tbcpu")


def test_trace_carries_step_overhead_and_model_chunks(recorded) -> None:
    _, tr = recorded
    over = tr.optype == OPTYPE_CODE["step-overhead"]
    # one per worker and step
    assert int(over.sum()) == tr.meta.n_workers * tr.n_steps
    comp = np.isin(tr.optype, [OPTYPE_CODE["forward-compute"], OPTYPE_CODE["backward-compute"]])
    assert np.array_equal(tr.gmc[comp], tr.mc[comp] * tr.meta.pp_size + tr.stage[comp])


def test_a_send_blocked_on_the_slow_rank_holds_back_the_all_reduce(recorded) -> None:
    doc, tr = recorded
    m = build_model(select_steps(tr, 0, doc["faulty_steps"]), "median")
    last = m.stage == 1
    bsend = np.flatnonzero(last & (m.optype == OPTYPE_CODE["backward-send"]))
    ar = int(np.flatnonzero(last & (m.optype == OPTYPE_CODE["grads-all-reduce"]))[0])
    assert int(bsend[np.argmax(m.seq[bsend])]) in m.deps[ar]
    # so the wait is not booked as the all-reduce's launch gap on the capped rank's pipeline partner
    assert float(np.median(m.delay[ar, 1])) < 0.005


def test_estimate_within_5_percent_of_the_measured_slowdown(recorded, measured_slowdown) -> None:
    doc, tr = recorded
    measured = measured_slowdown(doc)
    assert 1.7 < measured < 2.3  # the recorded fault really slowed the job
    r = analyze(select_steps(tr, 0, doc["faulty_steps"]), ideal="median", continuous=True,
                host_cpus=doc["host_cpus"])
    assert r.M_W_workers[0] == (1, 0) and r.root_cause.verdict == "individual_worker"
    sc = r.shared_cpu
    assert sc is not None
    assert abs(sc.T / r.T_trace - 1) < 1e-6  # the shared-CPU replay reproduces the trace
    estimate = sc.T / sc.T_fix_top
    assert abs(estimate / measured - 1) <= 0.05
    # on dedicated cores the capped rank's idle peers look faster than they would be: an overestimate
    dedicated = r.T / r.T_fix_top
    assert dedicated / measured - 1 > 0.10


@pytest.mark.parametrize("run", ["tbcpu", "tbdev"])  # shared cores; dedicated-device emulation
def test_healthy_and_faulty_replays_reproduce_the_measured_ratio(run: str, recorded_run, measured_slowdown) -> None:
    doc, tr = recorded_run(run)
    f = analyze(select_steps(tr, 0, doc["faulty_steps"]), ideal="median", continuous=True, max_sim_error=1e-6)
    h = analyze(select_steps(tr, 0, doc["healthy_steps"]), ideal="median", continuous=True, max_sim_error=1e-6)
    replay_ratio = f.T / h.T
    assert replay_ratio == pytest.approx(measured_slowdown(doc), rel=0.03)
