"""Both members of an Alertmanager HA pair deliver, to two remediator replicas behind one Redis: one event, one
action, one close.

Real Prometheus evaluates the shipped rules on a job's series (the detector's verdict included) and sends
FailSlowDetected to two real Alertmanagers from the shipped config. They are not clustered — the pair split by
a network partition, the case where both deliver every notification (clustered members mostly suppress each
other's copy through their notification log). Each calls its own remediator replica (as a load balancer in
front of two replicas would), all on one Redis.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from failslow_cli.stack.processes import (
    alertmanager,
    free_port,
    redis_server,
    render_alertmanager,
    start_remediator,
    stop_process,
)
from tests.integration.polling import wait_for
from tests.integration.remediator_stack import (
    JobSeries,
    fake_cluster_prometheus,
    get_json,
    wait_for_series,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "ha-token"
JOB = "llm-ha"


def _get(url: str, path: str) -> Any:
    return get_json(url, path, TOKEN)


def test_an_ha_pair_delivering_twice_to_two_replicas_acts_once(tmp_path: Path) -> None:
    record = tmp_path / "executed.jsonl"
    am_ports, rem_ports = [free_port(), free_port()], [free_port(), free_port()]
    cfg = {"jobs": [{"match": "llm-.*", "adapter": "fake", "options": {"record": str(record)}}],
           "policy": {"cooldown_s": 5.0}}
    env = {"FAILSLOW_REMEDIATOR_TICK_S": "1", "FAILSLOW_REMEDIATOR_CONFIRM_TIMEOUT_S": "120"}
    procs: list[Any] = []
    with redis_server(tmp_path / "redis", free_port(), persist=True) as redis, \
            fake_cluster_prometheus(tmp_path / "prom", [f"127.0.0.1:{p}" for p in am_ports]) as (prom_url, cluster):
        slow = JobSeries({(0, 0): 0.10, (0, 1): 0.10, (1, 0): 0.30, (1, 1): 0.10}, [4, 4],
                         onset_ts=time.time() - 120, healthy_s=0.55, suspects=[("compute", "1", "n1")])
        cluster.set(JOB, slow)
        wait_for_series(prom_url, JOB)
        try:
            reps = []
            for i, port in enumerate(rem_ports):
                reps.append(start_remediator(tmp_path / f"rem{i}", port, redis_url=redis.url, prometheus_url=prom_url,
                                             token=TOKEN, config=cfg, mode="auto", replica=f"r{i}", env=env))
                procs.append(reps[-1].proc)
            with alertmanager(render_alertmanager(tmp_path / "am0", remediator_url=f"{reps[0].url}/api/v1/alerts",
                                                  token=TOKEN), am_ports[0]), \
                    alertmanager(render_alertmanager(tmp_path / "am1", remediator_url=f"{reps[1].url}/api/v1/alerts",
                                                     token=TOKEN), am_ports[1]):
                # both members deliver FailSlowDetected; one event, one rebalance
                act = wait_for(lambda: [a for a in _get(reps[0].url, "/actions") if a["state"] == "succeeded"], 90,
                               "the rebalance", every=0.5)[0]
                assert act["strategy"] == "rebalance" and act["params"]["counts"] == [6, 2]
                audit = wait_for(lambda: [x for x in _get(reps[1].url, "/audit?limit=1000") if x["kind"] == "delivery"
                                          and x["data"].get("status") == "firing"] if {
                    x["replica"] for x in _get(reps[1].url, "/audit?limit=1000")
                    if x["kind"] == "delivery" and x["data"].get("status") == "firing"} == {"r0", "r1"} else None,
                    60, "both members' firing deliveries", every=0.5)
                outcomes = [o for x in audit for o in x["data"]["outcomes"]]
                assert outcomes.count("accepted") == 1 and "duplicate" in outcomes, outcomes
                assert all(x["data"]["receiver"] == "remediator" for x in audit)
                events = _get(reps[1].url, "/events")
                assert len(events) == 1 and events[0]["suspects"] == [{"kind": "compute", "rank": 1, "node": "n1"}]

                # the fault gone (and the job's own split back): the alert resolves, both members say so, and
                # the pace is confirmed back
                cluster.set(JOB, JobSeries({(0, 0): 0.10, (0, 1): 0.10, (1, 0): 0.10, (1, 1): 0.10}, [4, 4],
                                           healthy_s=0.55))
                ev = wait_for(lambda: (e := _get(reps[0].url, f"/events/{events[0]['id']}"))["state"] == "closed"
                              and e, 120, "the event to close", every=0.5)
                assert "confirmed back" in ev["close_reason"]
                resolved = [x for x in _get(reps[0].url, "/audit?limit=1000") if x["kind"] == "delivery"
                            and x["data"].get("status") == "resolved"]
                assert resolved, "no resolved delivery"
                closes = [x for x in _get(reps[0].url, "/audit?limit=1000") if x["kind"] == "event"
                          and x["data"].get("what") == "closed"]
                assert len(closes) == 1
                time.sleep(3)  # the replicas' next ticks: the restore to 4/4 may follow, nothing else
            execs = [json.loads(x) for x in record.read_text().splitlines()]
            first = [e for e in execs if e["params"].get("counts") == [6, 2]]
            assert len(first) == 1 and len({e["id"] for e in execs}) == len(execs), execs
        finally:
            for p in procs:
                stop_process(p)
