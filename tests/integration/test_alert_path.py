"""The whole alert path with real processes: an injected fault on the testbed reaches the remediator webhook.

Redis, Prometheus and Alertmanager (Debian binaries) run on free loopback ports from the shipped configs;
the exporter reads the rings a real testbed job writes through the torch.distributed hook; the detector
polls Prometheus. A fault on one rank (a 0.4 s stop-the-world pause every iteration) starts after a healthy
warm-up; a real HTTP receiver in the test, standing in for the remediator, must receive FailSlowDetected for
the job with the detector's suspect labels and the bearer token. The time from fault start to webhook
receipt is measured and printed (and written to docs/BENCHMARKS.md by `python -m bench alerting`), never
asserted.

After the fault is removed the job's FailSlowDetected group must resolve and the resolved notification
must reach the same webhook. The fault stays on for 60 s so that detection (the exporter's window, the
detector's verification samples, `for:` and `group_wait`: about 55 s measured) lands while it is on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow_cli.stack.alert_path import run_alert_path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]


def test_fault_reaches_the_remediator_webhook_with_suspects_then_resolves(tmp_path: Path) -> None:
    res = run_alert_path(tmp_path, fault_s=60.0, wait_resolved=True, max_after_s=150.0)
    print(res.summary())

    assert res.fault_start is not None, "the testbed never switched the fault on:\n" + res.testbed_log
    firing = res.firing
    assert firing, "no FailSlowDetected for the job reached the webhook:\n" + res.diagnostics()
    t_first, alert = firing[0]
    for _t, a in firing:
        print(f"  {a['labels']}\n    {a['annotations']['description']}")
    assert t_first >= res.fault_start, "FailSlowDetected arrived before the fault started (false alarm)"
    labels = alert["labels"]
    assert labels["job"] == res.job
    assert labels["severity"] == "warning" and labels["remediate"] == "true"
    assert alert["annotations"]["runbook_url"].endswith("/runbooks/FailSlowDetected.md")
    assert res.job in alert["annotations"]["description"]
    # the detector's suspect labels travel with the alert, and the injected rank is among them
    suspects = [a["labels"] for _t, a in firing if a["labels"].get("kind")]
    assert suspects, f"no suspect labels on the delivered alerts: {[a['labels'] for _t, a in firing]}"
    assert any(s["kind"] == "compute" and s.get("rank") == str(res.fault_rank) for s in suspects), suspects
    # every delivery went to the remediator path with the token from the credentials file
    assert {h.auth for h in res.receiver_posts} == {f"Bearer {res.token}"}
    assert {h.path for h in res.receiver_posts} == {"/api/v1/alerts"}
    assert all(h.body["receiver"] == "remediator" for h in res.receiver_posts)
    # nothing fired for the job before the fault (healthy warm-up stays quiet)
    assert all(t >= res.fault_start for t, _a in firing)
    # the fault is removed: the whole group resolves, delivered to the same webhook, while the job still runs
    assert res.fault_end is not None, "the testbed never switched the fault off:\n" + res.testbed_log
    assert res.resolved, "no resolved FailSlowDetected after the fault ended:\n" + res.diagnostics()
    assert res.resolved[0][0] >= res.fault_end
