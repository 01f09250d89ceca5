"""Dependency model and simulator: replaying traces exactly, and the definitions on a hand-made trace."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.whatif import analyze, build_model, trace_from_columns
from failslow.whatif.simulate import simulate_timeline
from failslow.whatif.synth import SynthConfig, generate
from failslow.whatif.trace import JobMeta

LAYOUTS = [
    dict(dp=2, pp=4, vpp=1, micro_batches=8),  # 1F1B
    dict(dp=2, pp=4, vpp=2, micro_batches=8),  # interleaved
    dict(dp=3, pp=2, vpp=3, micro_batches=4),  # interleaved, odd DP
    dict(dp=1, pp=3, vpp=1, micro_batches=2),  # fewer micro-batches than stages
    dict(dp=4, pp=1, vpp=1, micro_batches=3),  # pure data parallel
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "dp{dp}pp{pp}vpp{vpp}m{micro_batches}".format(**d))
def test_replays_traces_without_launch_delays_exactly(layout: dict) -> None:
    # with no untraced CPU gaps the model must reproduce every recorded start and end
    st = generate(SynthConfig(launch_delay=0.0, steps=3, seed=11, **layout))
    m = build_model(st.trace())
    start, end = simulate_timeline(m)
    np.testing.assert_allclose(start[m.simulated], m.start[m.simulated], atol=1e-12)
    np.testing.assert_allclose(end[m.simulated], m.end[m.simulated], atol=1e-12)
    r = analyze(st.trace())
    assert r.simulation_error < 1e-12


@pytest.mark.parametrize("layout", LAYOUTS[:3], ids=["1f1b", "vpp2", "vpp3"])
def test_launch_delays_are_the_only_simulation_error(layout: dict) -> None:
    st = generate(SynthConfig(launch_delay=0.0001, steps=3, seed=5, **layout))
    r = analyze(st.trace())
    assert 0 < r.simulation_error < 0.05
    assert r.T_trace > r.T  # removing the CPU gaps can only shorten the step


def _rows(ops: list[tuple]) -> dict:
    names = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id")
    cols = {n: [o[i] for o in ops] for i, n in enumerate(names)}
    out = {k: np.asarray(v) for k, v in cols.items() if k != "optype"}
    out["optype"] = np.asarray(cols["optype"], dtype=object)
    return out


def test_definitions_on_a_hand_made_data_parallel_trace() -> None:
    # Two DP ranks, one stage, one step: forward, backward, reduce-scatter (synchronises the two
    # ranks), optimizer. Rank 1's forward is slow (0.3 s instead of 0.1 s).
    fw = {0: 0.1, 1: 0.3}
    ops = []
    for d in (0, 1):
        ops += [(d, 0, d, 7, "forward-compute", 0.0, fw[d], 0, 0, 0, 0),
                (d, 0, d, 7, "backward-compute", fw[d], 0.2, 0, 0, 0, 0)]
        rs_start = fw[d] + 0.2
        ops.append((d, 0, d, 7, "grads-reduce-scatter", rs_start, 0.5 + 0.05 - rs_start, 0, 0, -1, -1))
        ops.append((d, 0, d, 7, "optimizer", 0.55, 0.1, 0, -1, -1, -1))
    t = trace_from_columns(_rows(ops), JobMeta(dp_size=2, pp_size=1))
    r = analyze(t)
    # original: rank 1 reaches the reduce-scatter at 0.5, transfer 0.05, optimizer 0.1 -> 0.65
    assert r.T_trace == pytest.approx(0.65)
    assert pytest.approx(0.65) == r.T
    # ideal: forward = mean(0.1, 0.3) = 0.2 on both ranks -> 0.2 + 0.2 + 0.05 + 0.1
    assert r.T_ideal == pytest.approx(0.55)
    assert pytest.approx(0.65 / 0.55) == r.S
    # only rank 1's forward is slow: it alone explains all, rank 0 alone makes it faster
    assert r.S_w[1, 0] == pytest.approx(0.65 / 0.55)
    assert r.S_w[0, 0] == pytest.approx(0.55 / 0.55)
    assert r.S_t["forward-compute"] == pytest.approx(0.65 / 0.55)
    assert r.S_t["backward-compute"] == pytest.approx(1.0)
    assert pytest.approx(1.0) == r.M_W  # idealising rank 1 removes the whole gap
    assert r.M_S is None  # no pipeline
    # the median idealisation takes the typical forward (0.1 vs 0.3 -> 0.2 median of two)
    assert analyze(t, ideal="median").T_ideal == pytest.approx(0.55)


def test_recorded_p2p_no_ops_are_recognised_and_left_out() -> None:
    # Interleaved profilers record a forward-recv even before stage 0's first model chunk, which
    # has no sender. Add such zero-length no-ops to a trace: the model must flag them and the
    # replay must stay exact.
    st = generate(SynthConfig(dp=2, pp=2, vpp=2, micro_batches=4, steps=2, launch_delay=0.0, seed=3))
    cols = {k: (v if k == "optype" else np.asarray(v).copy()) for k, v in st.columns.items()}
    codes, names = cols["optype"]
    fwd, frecv = names.index("forward-compute"), names.index("forward-recv")
    first_chunk = (codes == fwd) & (cols["stage"] == 0) & (cols["gmc"] == 0)
    extra = {k: (v[first_chunk].copy() if k != "optype" else None) for k, v in cols.items()}
    extra["duration"][:] = 0.0
    extra["mc"][:] = extra["gmc"][:] = extra["mb_id"][:] = -1
    merged = {k: np.concatenate([cols[k], extra[k]]) for k in cols if k != "optype"}
    merged_codes = np.concatenate([codes, np.full(int(first_chunk.sum()), frecv)])
    # renumber forward-recv seq_id on stage 0 in time order, per (dp, step)
    sel = np.flatnonzero((merged_codes == frecv) & (merged["stage"] == 0))
    order = sel[np.lexsort((merged["start_ts"][sel], merged["step"][sel], merged["dp_rank"][sel]))]
    key = merged["dp_rank"][order] * 10_000 + merged["step"][order]
    first = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    counts = np.diff(np.r_[first, order.size])
    merged["seq_id"][order] = np.arange(order.size) - np.repeat(first, counts)
    merged["optype"] = (merged_codes, names)
    from failslow.whatif import trace_from_columns

    t = trace_from_columns(merged, st.meta)
    m = build_model(t)
    assert m.n_noops == int(first_chunk.sum()) // (2 * 2)  # per template: no-ops of one dp rank, one step
    _start, end = simulate_timeline(m)
    np.testing.assert_allclose(end[m.simulated], m.end[m.simulated], atol=1e-12)
    assert analyze(t).simulation_error < 1e-12
