"""Spare nodes without namespaces (loopback, as for a user without root): extra node indices a restart may use.

The namespace case (a throttled node's ranks onto a spare through the remediator's adapter) is
tests/integration/test_testbed_spares.py.
"""

from __future__ import annotations

import time

import pytest

from failslow.errors import InputError
from testbed.config import ModelConfig
from testbed.launcher import JobConfig, Testbed
from testbed.validation import expected_pause_s

pytestmark = [pytest.mark.integration, pytest.mark.testbed]


def test_loopback_spares_are_node_indices_a_restart_may_use() -> None:
    cfg = JobConfig(dp=2, pp=1, iterations=16, micro_batches=2, model=ModelConfig(d_model=64, layers=2),
                    spare_nodes=2, namespaces=False)
    with Testbed(cfg) as tb:
        with pytest.raises(InputError, match="link faults are unavailable"):
            tb.inject("link:node=3,rate=20mbit")
        tb.faults.clear()
        tb.start()
        deadline = time.monotonic() + 120
        while tb.completed() < 3 and time.monotonic() < deadline:
            tb.poll()
            time.sleep(0.05)
        st = tb.status()
        assert st["num_nodes"] == 4 and st["spare_nodes"] == [2, 3] and st["placement"] == [0, 1]
        assert st["resume_iteration"] == 0 and st["restart_pause_s"] is None
        # what the job took to come up is what a restart is expected to cost before one was measured
        up = st["startup_s"]
        assert 0 < up < time.time() - tb.start_unix
        assert st["expected_costs"] == {"rebalance": 0.0, "validate": expected_pause_s(2), "topology": up,
                                        "restart": up}
        resumed = tb.restart([0, 3])
        rep = tb.wait(timeout_s=120)
        st = tb.status()
    assert st["spare_nodes"] == [1, 2] and st["resume_iteration"] == resumed and st["restart_pause_s"] > 0
    assert st["startup_s"] == up  # the job's first start, not the restart's
    assert rep["placement"] == [0, 3] and rep["num_nodes"] == 4 and rep["layout"]["num_nodes"] == 2
    for r in "01":
        assert rep["iterations"][r] == list(range(16))
