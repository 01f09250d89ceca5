"""The closed loop with every part real: a CPU fault slows one rank of a testbed job, the detector confirms it,
Alertmanager calls the remediator (mode auto, shipped configs), which rebalances the micro-batches through
the testbed adapter; the job's pace improves; once the fault is gone the remediator returns to the job's own
split, the alert resolves and the event closes with the pace confirmed back.

The job runs with the testbed's dedicated-device emulation (each rank a device of speed 0.4) so that a CPU
quota slows only its rank, as a throttled GPU would, and moving micro-batches away from it pays. What is
measured (times, paces, the prediction beside the outcome) is printed; the assertions are on behaviour.
It is also the test of the alert path: the event carries the labels the alert had (the shipped rule's
routing labels, the detector's suspects), the webhook only takes the token Alertmanager reads from its
credentials file, and the event closes only once the resolved notification has arrived.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from failslow_cli.stack.loop import run_loop

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.timeout(600), pytest.mark.testbed]


def test_fault_alert_rebalance_recovery_restore_close(tmp_path: Path) -> None:
    # "back" = within 1.25x of the healthy pace measured before the fault: on this shared 2-core host the
    # pace of a job with no fault drifted 10-23% within minutes (one run ended 245 s after the job's own
    # split was back, at 1.12-1.23x, never confirmed within the default 1.1x); the fault itself is 2.9x
    res = run_loop(tmp_path, fault_s=110.0, max_s=420.0, policy={"recovered_ratio": 1.25})
    s = res.state
    print(res.summary())
    diag = f"{res.summary()}\nactions: {s.actions}\nevents: {s.events}\nremediator log:\n" \
           f"{res.logs.get('remediator', '')[-4000:]}\ntestbed:\n{res.logs.get('testbed', '')[-2000:]}\n" \
           f"timeline: {_timeline(res.audit, s.t0)}"
    assert s.fault_start is not None and s.fault_end is not None, diag
    ev = s.event
    assert ev is not None and ev["opened_at"] >= s.fault_start, "no event opened after the fault:\n" + diag
    # what the alert carried: the shipped rule's routing labels and the detector's suspect labels
    assert ev["labels"].get("alertname") == "FailSlowDetected" and ev["labels"].get("job") == s.job, ev["labels"]
    assert ev["labels"].get("severity") == "warning" and ev["labels"].get("remediate") == "true", ev["labels"]
    assert ev["suspects"] and all(x["kind"] in ("compute", "link") for x in ev["suspects"]), diag

    acts = sorted((a for a in s.actions if a["job"] == s.job and a["event_id"] == ev["id"]),
                  key=lambda a: a["created_at"])
    assert acts, "the remediator took no action:\n" + diag
    first = acts[0]
    # the decision: rebalance away from the slowed replica (rank 1 is DP replica 1), predicted faster
    assert first["strategy"] == "rebalance" and first["state"] == "succeeded" and not first["dry_run"], diag
    counts = first["params"]["counts"]
    assert sum(counts) == 8 and counts[1] < 4 < counts[0], first
    pred = first["predicted"]
    assert pred["pace_s"] < pred["pace_before_s"], pred
    assert first["started_at"] < s.fault_end, "the rebalance came after the fault was gone:\n" + diag
    # the audit names the decision, with the prediction
    decisions = [x for x in res.audit if x["kind"] == "decision" and x["data"].get("strategy") == "rebalance"]
    assert decisions and decisions[-1]["data"]["chosen"]["predicted_s"], res.audit[:5]
    # the job's pace, from the trainer's own iteration times: slow before the action, faster after it
    slow = s.pace(s.fault_start + 20.0, float(first["started_at"]))
    mitigated = s.pace(float(first["ended_at"]) + 25.0, s.fault_end)
    healthy = s.pace(s.t0 + 15.0, s.fault_start)
    print(f"iteration time: healthy {healthy}, with the fault {slow}, after the rebalance {mitigated}; "
          f"predicted {pred['pace_s']:.3f} s (model) vs measured {mitigated}; "
          f"decision latency {first.get('decision_latency_s')} s; measured by the remediator "
          f"{first.get('measured')}")
    assert slow is not None and mitigated is not None and healthy is not None, diag
    assert mitigated < 0.9 * slow, f"the pace did not improve: {slow:.3f} -> {mitigated:.3f} s\n" + diag
    reduced = (slow - mitigated) / (slow - healthy)
    print(f"slowdown reduced by {reduced:.0%} ({slow / healthy:.2f}x -> {mitigated / healthy:.2f}x)")

    # after the fault: back to the job's own split, the alert resolved, the event closed with the pace back
    assert res.microbatches_final == [4, 4], (res.microbatches_final, diag)
    assert ev["state"] == "closed" and "confirmed back" in ev["close_reason"], diag
    assert ev["resolved_at"] is not None, "the resolved notification never reached the remediator:\n" + diag
    assert sum(1 for x in res.audit if x["kind"] == "event" and x["event"] == ev["id"]
               and x["data"].get("what") == "closed") == 1
    # nothing ran twice: every action executed once, one at a time
    ran = [a for a in s.actions if a["job"] == s.job and a["state"] in ("succeeded", "failed")]
    assert len({a["id"] for a in ran}) == len(ran)
    spans = sorted((float(a["started_at"]), float(a["ended_at"])) for a in ran)
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))


def _timeline(audit: list[dict[str, Any]], t0: float) -> str:
    """The remediator's audit on one line (seconds since the job started): a failure's message is often
    shown by its head and tail only, and this line ends it."""
    out = []
    for x in sorted(audit, key=lambda x: x["ts"]):
        d = x.get("data") or {}
        if x["kind"] == "decision":
            what = f"{d.get('strategy')}: {str(d.get('reason'))[:90]}"
        elif x["kind"] == "delivery":
            what = ",".join(sorted({str(a.get("status")) for a in d.get("alerts") or []}))
        elif x["kind"] in ("judgement", "event"):
            what = str(d.get("verdict") or d.get("what"))[:60]
        else:
            continue
        out.append(f"{x['ts'] - t0:.0f}s {x['kind']} {what}")
    return " | ".join(out)
