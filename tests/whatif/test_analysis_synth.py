"""Every injected cause x the analysis: the right verdict, heatmap pattern and slowdown estimate."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.whatif import analyze
from failslow.whatif.synth import SynthConfig, generate, healthy

BASE = dict(dp=4, pp=4, micro_batches=8, steps=4)

SCENARIOS = {
    "healthy": SynthConfig(**BASE, seed=1),
    "slow_worker": SynthConfig(**BASE, slow_workers=((2, 1, 1.6),), seed=2),
    "slow_worker_last_stage": SynthConfig(**BASE, slow_workers=((0, 3, 1.4),), seed=3),
    "stage_imbalance": SynthConfig(**BASE, stage_factors=((3, 1.7),), seed=4),
    "stage_imbalance_first": SynthConfig(**BASE, stage_factors=((0, 1.5),), seed=5),
    "sequence_lengths": SynthConfig(**BASE, seq_cv=0.3, seed=6),
    "gc_pauses": SynthConfig(**BASE, gc_prob=0.3, gc_pause=0.08, seed=7),
    "slow_worker_vpp": SynthConfig(dp=2, pp=4, vpp=2, micro_batches=8, steps=3, slow_workers=((1, 2, 1.5),),
                                   launch_delay=5e-5, seed=8),
}


@pytest.fixture(scope="module")
def results() -> dict:
    out = {}
    for k, cfg in SCENARIOS.items():
        st = generate(cfg)
        out[k] = (cfg, st, analyze(st.trace()))
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_verdict_matches_the_injected_cause(results, name: str) -> None:
    _cfg, st, r = results[name]
    assert r.root_cause.verdict == st.truth["causes"][0], r.root_cause
    assert r.simulation_error < 0.05


def test_healthy_job_has_no_slowdown(results) -> None:
    r = results["healthy"][2]
    assert r.S < 1.02
    assert np.all(np.abs(r.S_w - 1) < 0.02)


@pytest.mark.parametrize("name", ["slow_worker", "slow_worker_last_stage", "slow_worker_vpp"])
def test_slow_worker_is_the_hottest_cell_and_explains_the_slowdown(results, name: str) -> None:
    cfg, _st, r = results[name]
    d, p, _f = cfg.slow_workers[0]
    assert np.unravel_index(int(np.argmax(r.S_w)), r.S_w.shape) == (d, p)
    assert r.M_W_workers[0] == (d, p)
    assert r.M_W is not None and r.M_W > 0.6
    assert r.root_cause.evidence["dp_rank"] == d and r.root_cause.evidence["pp_rank"] == p
    # the other DP ranks of the worker's stage stay near 1 (a cell, not a column)
    others = np.delete(r.S_w[:, p], d)
    assert others.max() < 1 + 0.3 * (r.S_w[d, p] - 1)


@pytest.mark.parametrize("name", ["stage_imbalance", "stage_imbalance_first"])
def test_stage_imbalance_lights_a_whole_column(results, name: str) -> None:
    cfg, _st, r = results[name]
    p = cfg.stage_factors[0][0]
    assert max(r.S_stage, key=lambda k: r.S_stage[k]) == p
    col = r.S_w[:, p]
    assert col.min() > 1.05 and col.max() / col.min() < 1.05
    assert r.root_cause.evidence["stage"] == p
    if p == cfg.pp - 1:
        assert r.M_S is not None and r.M_S > 0.8


def test_sequence_length_imbalance_shows_forward_backward_correlation(results) -> None:
    r = results["sequence_lengths"][2]
    ev = r.root_cause.evidence
    assert ev["forward_backward_correlation"] > 0.8
    assert r.S_t["forward-compute"] > 1.02 and r.S_t["backward-compute"] > 1.02
    for k in ("slow_worker", "stage_imbalance"):  # persistent effects are not mistaken for it
        assert results[k][2].root_cause.evidence.get("forward_backward_correlation", 0.0) < 0.5 or \
            results[k][2].root_cause.verdict != "sequence_length_imbalance"


def test_gc_pauses_show_in_the_op_type_and_in_the_worst_steps(results) -> None:
    _cfg, _st, r = results["gc_pauses"]
    assert max(r.S_t, key=lambda k: r.S_t[k]) == "gc"
    assert r.root_cause.evidence["gc_max_s"] > 0.04


def test_median_ideal_estimates_the_measured_slowdown_of_a_slow_worker() -> None:
    # the measured slowdown: the same job (same noise) with and without the slow worker
    for f in (1.3, 1.6, 2.0):
        cfg = SynthConfig(**BASE, slow_workers=((1, 2, f),), seed=21)
        measured = generate(cfg).mean_step_time / generate(healthy(cfg)).mean_step_time
        est = analyze(generate(cfg).trace(), ideal="median").S
        assert est == pytest.approx(measured, rel=0.05), f


def test_per_step_slowdown_singles_out_the_disturbed_step() -> None:
    cfg = SynthConfig(dp=2, pp=2, micro_batches=4, steps=6, seed=9)
    st = generate(cfg)
    cols = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in st.columns.items()}
    # one step (id 103) gets a 50 ms GC pause on one worker, before its optimizer runs
    codes, names = cols["optype"]
    gc = (codes == names.index("gc")) & (cols["step"] == 103) & (cols["dp_rank"] == 1) & (cols["stage"] == 0)
    later = (cols["step"] == 103) & (cols["dp_rank"] == 1) & (cols["stage"] == 0) & \
        (cols["start_ts"] >= cols["start_ts"][gc][0]) & ~gc
    cols["duration"][gc] += 0.05
    cols["start_ts"][later] += 0.05
    from failslow.whatif import trace_from_columns

    r = analyze(trace_from_columns(cols, st.meta), max_sim_error=0.5)
    assert max(r.per_step, key=lambda k: r.per_step[k]) == 103


def test_refuses_when_the_model_does_not_explain_the_trace() -> None:
    st = generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=2, launch_delay=0.004, seed=2))
    with pytest.raises(InputError, match="simulation error"):
        analyze(st.trace())
    assert analyze(st.trace(), max_sim_error=1.0).simulation_error > 0.05


def test_continuous_mode_replays_back_to_back_steps_and_finds_the_worker() -> None:
    cfg = SynthConfig(**BASE, slow_workers=((2, 1, 1.6),), seed=2)
    t = generate(cfg).trace()
    r = analyze(t, continuous=True, ideal="median")
    assert r.launch_delays == "ideal"
    assert r.simulation_error < 1e-9  # measured gaps kept: the original replays exactly
    assert r.M_W_workers[0] == (2, 1)
    assert r.root_cause.verdict == "individual_worker"
    step_mode = analyze(t, ideal="median", launch_delays="ideal")
    assert r.T / r.T_fix_top == pytest.approx(step_mode.T / step_mode.T_fix_top, rel=0.1)



def test_fixed_straggler_costs_what_the_others_cost_on_average() -> None:
    # right-skewed compute (lognormal micro-batch lengths) and one worker twice as slow: fixed, it
    # takes the others' mean whatever --ideal says (their samples hold no straggler to be robust
    # against; their median would make it cheaper than they are)
    t = generate(SynthConfig(dp=4, pp=2, micro_batches=8, steps=6, seq_cv=0.5, slow_workers=((1, 0, 2.0),),
                             seed=11)).trace()
    by_median = analyze(t, ideal="median", max_sim_error=0.5)
    by_mean = analyze(t, ideal="mean", max_sim_error=0.5)
    assert by_median.M_W_workers[0] == by_mean.M_W_workers[0] == (1, 0)
    assert by_median.T_fix_top == pytest.approx(by_mean.T_fix_top, rel=1e-12)
    assert by_median.T_ideal < by_mean.T_ideal  # while T_ideal does follow --ideal
