"""The shared-CPU (processor-sharing) replay used for CPU testbeds."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.whatif import analyze
from failslow.whatif.cpushare import busy_rate_integral
from failslow.whatif.synth import SynthConfig, generate


def test_demand_integrates_the_share_of_a_core() -> None:
    starts, ends = np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])
    # one core: [1, 2] is shared by two intervals, each gets half of it
    assert busy_rate_integral(starts, ends, 1.0) == pytest.approx([1.5, 1.5, 1.0])
    # two cores: nothing is shared
    assert busy_rate_integral(starts, ends, 2.0) == pytest.approx([2.0, 2.0, 1.0])
    # three intervals on two cores: each runs at 2/3 while all three overlap
    s3, e3 = np.array([0.0, 0.0, 0.0]), np.array([3.0, 3.0, 3.0])
    assert busy_rate_integral(s3, e3, 2.0) == pytest.approx([2.0, 2.0, 2.0])
    with pytest.raises(InputError, match="CPUs"):
        busy_rate_integral(starts, ends, 0.0)


def test_shared_replay_reproduces_the_trace_and_matches_dedicated_cores_without_contention() -> None:
    t = generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=4, slow_workers=((1, 0, 1.8),), seed=3)).trace()
    base = analyze(t, continuous=True, ideal="median")
    tight = analyze(t, continuous=True, ideal="median", host_cpus=1.5)
    loose = analyze(t, continuous=True, ideal="median", host_cpus=1e6)
    assert base.shared_cpu is None and tight.shared_cpu is not None and loose.shared_cpu is not None
    # the demands are read from the trace's own busy profile: the replay lands on the measured period
    replay_tight, replay_loose = tight.shared_cpu.T, loose.shared_cpu.T
    assert replay_tight == pytest.approx(tight.T_trace, rel=1e-6)
    assert replay_loose == pytest.approx(loose.T_trace, rel=1e-6)
    # with more cores than work nothing is shared: the same timelines as the dedicated model
    assert loose.shared_cpu.T_fix_top == pytest.approx(base.T_fix_top, rel=1e-6)
    assert loose.shared_cpu.T_ideal == pytest.approx(base.T_ideal, rel=1e-6)
    # fixing the straggler on shared cores lets the others compete again: never faster than dedicated
    assert tight.shared_cpu.T_fix_top >= base.T_fix_top * (1 - 1e-9)
    js = tight.to_json()["shared_cpu"]
    assert js["host_cpus"] == 1.5 and js["S_fix_top"] == pytest.approx(tight.T / tight.shared_cpu.T_fix_top)


def test_shared_cpu_needs_continuous_mode() -> None:
    t = generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=2, seed=1)).trace()
    with pytest.raises(InputError, match="continuous"):
        analyze(t, host_cpus=2)
