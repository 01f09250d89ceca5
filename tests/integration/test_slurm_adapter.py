"""The Slurm adapter against a real one-machine Slurm: drain the bad node, requeue the job, see it run elsewhere.

`failslow_cli.stack.slurm` starts munged, slurmctld and three slurmd (n1..n3, one CPU each, so a two-node
job leaves one node free) in a temp dir, as root. The training job is a real batch script submitted with
``sbatch --requeue -N 2``: it resumes from its own checkpoint file and logs one line per step with
``$SLURM_RESTART_COUNT`` and ``$SLURM_JOB_NODELIST``, so the test can see from the job's side that it was
restarted, where it ran and that it continued. The pause the adapter measures is printed, not asserted
beyond being positive (the requeue hold, ``cred_expire``, is 5 s in the test cluster and 120 s by default).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from failslow_cli.stack.slurm import SlurmCluster, slurm_cluster
from remediator.adapters import build
from remediator.adapters.base import ActionOutcome, ActionRequest, AdapterError, ConfigError
from remediator.adapters.slurm import (
    DEFAULT_CRED_EXPIRE_S,
    Adapter,
    SlurmJob,
    clean_reason,
    parse_fields,
    parse_marker,
    parse_time,
    reason_names,
    requeue_hold_s,
)
from tests.integration.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = "llm-pretrain"
# the job's series name nodes by their hostnames; Slurm calls them n1..n3
NODE_MAP = {"host-n1": "n1", "host-n2": "n2", "host-n3": "n3"}
CRED_EXPIRE_S = 5  # the test cluster's: a requeued job waits 6 s before it may start

SCRIPT = """#!/bin/bash
# A stand-in training job: resume from the checkpoint, one line per step (step restart nodes time).
# A step is saved and logged by shell builtins, and a TERM (Slurm's stop) waits for the step to finish:
# a stop between the two writes would otherwise log a step its checkpoint does not hold.
dir={dir}
stop=
trap 'stop=1' TERM
step=$(cat "$dir/ckpt" 2>/dev/null || echo 0)
while [ -z "$stop" ]; do
  step=$((step + 1))
  echo "$step" > "$dir/ckpt"
  echo "$step ${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_NODELIST $EPOCHREALTIME" >> "$dir/progress"
  sleep 0.2 & wait $!
done
"""


def show_job(cluster: SlurmCluster, job_id: int) -> dict[str, str]:
    return parse_fields(cluster.run("scontrol", "show", "job", "-o", str(job_id)).stdout.splitlines()[0])


def hostnames(cluster: SlurmCluster, node_list: str) -> list[str]:
    return cluster.run("scontrol", "show", "hostnames", node_list).stdout.split()


def node_reason(cluster: SlurmCluster, node: str) -> tuple[str, str]:
    state, _, reason = cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%T\t%E").stdout.strip().partition("\t")
    return state, reason


def submit(cluster: SlurmCluster, name: str, workdir: Path, *args: str) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "train.sh"
    script.write_text(SCRIPT.format(dir=workdir))
    job_id = cluster.sbatch(script, "-J", name, *args)
    wait_for(lambda: show_job(cluster, job_id)["JobState"] == "RUNNING", 30, f"job {job_id} RUNNING", every=0.2)
    return job_id


def progress(workdir: Path) -> list[tuple[int, int, str]]:
    rows = []
    for line in (workdir / "progress").read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    return rows


def options(cluster: SlurmCluster, **extra: Any) -> dict[str, Any]:
    return {"slurm_conf": str(cluster.conf), "bin_dir": cluster.bin_dir, "node_map": NODE_MAP,
            "wait_running_s": 60, "poll_interval_s": 0.2, **extra}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    t0 = time.monotonic()
    with slurm_cluster(("n1", "n2", "n3"), cred_expire_s=CRED_EXPIRE_S) as c:
        print(f"Slurm up in {time.monotonic() - t0:.1f}s at {c.root}")
        yield c


@dataclass
class Restarted:
    adapter: Adapter
    request: ActionRequest
    outcome: ActionOutcome
    job_id: int
    workdir: Path
    bad: str
    old_nodes: list[str]
    before: list[tuple[int, int, str]]
    seconds: float


@pytest.fixture(scope="module")
def restarted(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Restarted:
    """The action under test, done once: restart the running job without its last node."""
    wait_for(lambda: set(cluster.node_states().values()) == {"idle"}, 30, "all nodes idle", every=0.2)
    workdir = tmp_path_factory.mktemp("slurm-job")
    job_id = submit(cluster, JOB, workdir, "--requeue", "-N", "2")
    wait_for(lambda: (workdir / "progress").exists() and len(progress(workdir)) >= 5, 30, "a few steps",
             every=0.2)
    adapter = build("slurm", JOB, {"cluster": "test"}, options(cluster))
    assert isinstance(adapter, Adapter)

    info = adapter.info()
    fields = show_job(cluster, job_id)
    old_nodes = hostnames(cluster, fields["NodeList"])
    assert info.nodes == [f"host-{n}" for n in old_nodes]
    # before any restart: the requeue hold plus the wait this run had once eligible
    start, eligible = parse_time(fields["StartTime"]), parse_time(fields["EligibleTime"])
    assert start is not None and eligible is not None, fields
    waited = start - eligible
    assert info.costs == {"restart": CRED_EXPIRE_S + 1 + waited}, info.costs
    assert info.extra["slurm_job_id"] == str(job_id) and info.extra["state"] == "RUNNING"
    assert info.extra["partition"] == cluster.partition

    bad = old_nodes[-1]
    request = ActionRequest(id="act-7f3a", job=JOB, strategy="restart", reason="rank 3 compute 1.8x slower",
                            params={"exclude_nodes": [f"host-{bad}"], "exclude_ranks": [3]})
    before = progress(workdir)
    t0 = time.monotonic()
    outcome = adapter.execute(request)
    seconds = time.monotonic() - t0
    print(f"execute took {seconds:.1f}s: {outcome.to_json()}")
    return Restarted(adapter, request, outcome, job_id, workdir, bad, old_nodes, before, seconds)


def test_capabilities_are_restart_only(cluster: SlurmCluster) -> None:
    adapter = Adapter(JOB, {}, options(cluster))
    assert adapter.capabilities() == frozenset({"restart"})
    assert adapter.kind == "slurm"


@pytest.mark.parametrize("bad", [
    {"wait_runing_s": 5},                       # a typo is not silently ignored
    {"wait_running_s": "soon"},
    {"wait_running_s": -1},
    {"wait_running_s": True},
    {"poll_interval_s": 0},
    {"node_map": {"host-n1": 1}},
    {"node_map": {"host-n1": "n1", "other": "n1"}},
    {"node_map": ["n1"]},
    {"bin_dir": "/nonexistent"},
    {"slurm_conf": "/nonexistent/slurm.conf"},
    {"job_name": "{job.__class__}"},
    {"job_name": "{no_such_label}"},
    {"drain_reason": "{nope}"},
    {"ranks_per_node": 0},
    {"env": {"SLURM_CONF": 3}},
])
def test_bad_options_are_config_errors(cluster: SlurmCluster, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        build("slurm", JOB, {}, {**options(cluster), **bad})


def test_job_name_matching_nothing_is_a_permanent_error(cluster: SlurmCluster) -> None:
    adapter = Adapter("no-such-job", {}, options(cluster))
    request = ActionRequest(id="act-none", job="no-such-job", strategy="restart",
                            params={"exclude_nodes": ["host-n1"]})
    with pytest.raises(AdapterError) as err:
        adapter.execute(request)
    assert not err.value.transient and "no-such-job" in str(err.value)
    with pytest.raises(AdapterError):
        adapter.info()
    assert adapter.recover(request) is None
    with pytest.raises(AdapterError, match="only 'restart'"):
        adapter.execute(ActionRequest(id="act-rb", job="no-such-job", strategy="rebalance"))


def test_refuses_before_draining_anything(cluster: SlurmCluster, tmp_path: Path) -> None:
    """A job Slurm will not requeue, a node that is not the job's, ranks without a layout: nothing changes."""
    wait_for(lambda: set(cluster.node_states().values()) == {"idle"}, 30, "all nodes idle", every=0.2)
    job_id = submit(cluster, "pinned", tmp_path, "--no-requeue", "-N", "1")
    node = show_job(cluster, job_id)["NodeList"]
    other = next(n for n in cluster.nodes if n != node)
    # found by the job-id label of the alert this time
    adapter = Adapter("pinned", {}, options(cluster))
    labels = {"slurm_job_id": str(job_id)}
    cases: list[tuple[dict[str, Any], str]] = [({"exclude_nodes": [f"host-{node}"]}, "cannot be requeued"),
                                               ({"exclude_nodes": [f"host-{other}"]}, "not among"),
                                               ({"exclude_ranks": [0]}, "ranks_per_node"),
                                               ({}, "needs exclude_nodes")]
    try:
        for params, message in cases:
            request = ActionRequest(id="act-refused", job="pinned", strategy="restart", params=params, labels=labels)
            with pytest.raises(AdapterError, match=message) as err:
                adapter.execute(request)
            assert not err.value.transient
        assert set(cluster.node_states().values()) <= {"idle", "allocated"}, cluster.node_states()
        fields = show_job(cluster, job_id)
        assert fields["JobState"] == "RUNNING" and fields["Restarts"] == "0"
        assert fields.get("AdminComment", "(null)") in ("", "(null)")
        assert adapter.recover(request) is None
    finally:
        cluster.run("scancel", str(job_id))
        wait_for(lambda: show_job(cluster, job_id)["JobState"] == "CANCELLED", 30, "the pinned job to leave",
                 every=0.2)


def test_restart_drains_the_node_and_the_job_runs_on_without_it(cluster: SlurmCluster, restarted: Restarted) -> None:
    r, out = restarted, restarted.outcome
    print(f"pause {out.pause_s:.1f}s, old nodes {r.old_nodes}, new nodes {out.result['new_nodes']}")
    assert out.ok, out.detail
    assert out.result["slurm_job_id"] == str(r.job_id)
    assert out.result["drained"] == [r.bad]
    assert out.pause_s is not None and 0 < out.pause_s <= r.seconds

    state, reason = node_reason(cluster, r.bad)
    assert state == "drained", state
    assert r.request.id in reason and "rank 3 compute 1.8x slower" in reason

    fields = show_job(cluster, r.job_id)
    assert fields["JobState"] == "RUNNING" and fields["Restarts"] == "1"
    new_nodes = hostnames(cluster, fields["NodeList"])
    assert r.bad not in new_nodes and len(new_nodes) == 2
    assert out.result["new_nodes"] == new_nodes
    assert hostnames(cluster, fields["ExcNodeList"]) == [r.bad] and out.result["excluded"] is True

    # the job's own view: restarted once, on the new nodes, continuing from its checkpoint
    wait_for(lambda: any(row[1] == 1 for row in progress(r.workdir)), 30, "steps of the restarted run",
             every=0.2)
    rows = progress(r.workdir)
    first_run = [row for row in rows if row[1] == 0]
    second_run = [row for row in rows if row[1] == 1]
    assert {row[2] for row in first_run} == {show_job_nodelist(cluster, r.old_nodes)}
    assert all(r.bad not in hostnames(cluster, row[2]) for row in second_run)
    assert second_run[0][0] == first_run[-1][0] + 1, "the job did not resume from its checkpoint"
    assert len(first_run) >= len(r.before)


def show_job_nodelist(cluster: SlurmCluster, nodes: list[str]) -> str:
    """The compressed form Slurm gives $SLURM_JOB_NODELIST for `nodes`."""
    return cluster.run("scontrol", "show", "hostlist", ",".join(nodes)).stdout.strip()


def test_after_a_restart_the_expected_cost_is_at_most_its_pause(cluster: SlurmCluster,
                                                                restarted: Restarted) -> None:
    """Slurm's estimate for the next restart, read after one, is a lower bound of the pause the adapter
    measured (to Slurm's one-second resolution): the requeue's pause without the time the job took to stop."""
    r, out = restarted, restarted.outcome
    assert out.ok and out.pause_s is not None
    fields = show_job(cluster, r.job_id)
    start, submit = parse_time(fields["StartTime"]), parse_time(fields["SubmitTime"])
    assert start is not None and submit is not None, fields
    cost = r.adapter.info().costs["restart"]
    print(f"measured pause {out.pause_s:.2f} s, expected cost now {cost:.2f} s")
    # after a requeue: back in the queue (SubmitTime) -> held -> started, all of it but the stop
    assert cost >= CRED_EXPIRE_S + 1 and abs(cost - (start - submit)) <= 1.0, (cost, fields)
    assert cost <= out.pause_s + 1.0, (cost, out.pause_s)


def test_recover_reports_the_restart_without_acting_again(cluster: SlurmCluster, restarted: Restarted) -> None:
    r = restarted
    before = show_job(cluster, r.job_id)
    got = r.adapter.recover(r.request)
    assert got is not None and got.ok, got
    assert got.result["drained"] == [r.bad] and got.result["slurm_job_id"] == str(r.job_id)
    assert got.result["restarts_before"] == 0 and got.result["restarts"] == 1
    time.sleep(1.0)
    after = show_job(cluster, r.job_id)
    assert after["Restarts"] == before["Restarts"] == "1" and after["JobState"] == "RUNNING"
    assert after["StartTime"] == before["StartTime"], "recover() restarted the job"
    assert node_reason(cluster, r.bad)[0] == "drained"

    # a retried execute (its first answer lost) reports the restart instead of doing it twice
    again = r.adapter.execute(r.request)
    assert again.ok and "already carried out" in again.detail, again.detail
    assert show_job(cluster, r.job_id)["Restarts"] == "1"

    # an action nobody carried out leaves no trace: unknown, not a failure
    assert r.adapter.recover(ActionRequest(id="act-never", job=JOB, strategy="restart")) is None
    # an action interrupted after marking the job but before the requeue reports so, and is not redone
    cluster.run("scontrol", "update", f"JobId={r.job_id}", "AdminComment=failslow:act-half:restarts=1")
    half = r.adapter.recover(ActionRequest(id="act-half", job=JOB, strategy="restart"))
    assert half is not None and not half.ok and "not requeued" in half.detail
    assert show_job(cluster, r.job_id)["Restarts"] == "1"


def test_an_unreachable_controller_is_a_transient_error() -> None:
    with slurm_cluster(("c1",)) as c:
        adapter = Adapter(JOB, {}, {"slurm_conf": str(c.conf), "bin_dir": c.bin_dir, "command_timeout_s": 30})
        ctld = c.procs["slurmctld"]
        ctld.terminate()
        ctld.wait(timeout=20)
        with pytest.raises(AdapterError) as err:
            adapter.info()
        assert err.value.transient, str(err.value)


# --- the pure parsing the adapter relies on, on literals as Slurm 22.05 prints them ---

SHOW_JOB = ("JobId=42 JobName=llm pretrain UserId=root(0) GroupId=root(0) MCS_label=N/A JobState=PENDING "
            "Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 "
            "SubmitTime=2026-11-25T10:57:51 EligibleTime=2026-11-25T10:59:52 StartTime=2026-11-25T10:59:52 "
            "EndTime=Unknown Partition=main AllocNode:Sid=localhost:5952 "
            "ReqNodeList=(null) ExcNodeList=n2 NodeList= NumNodes=2 NumCPUs=2 ReqB:S:C:T=0:0:*:* "
            "Socks/Node=* AdminComment=failslow:act-1:restarts=0 Power=")


def test_parse_show_job_line() -> None:
    f = parse_fields(SHOW_JOB)
    assert f["JobName"] == "llm pretrain" and f["ReqB:S:C:T"] == "0:0:*:*" and f["Power"] == ""
    job = SlurmJob.from_fields(f)
    assert (job.job_id, job.state, job.restarts, job.num_nodes) == ("42", "PENDING", 1, 2)
    assert job.node_list == "" and job.exc_node_list == "n2" and job.requeue and job.batch
    assert job.start_time is not None and job.eligible_time == job.start_time
    assert parse_marker(job.admin_comment) == ("act-1", 0)
    assert parse_marker("site note") is None


def test_requeue_hold_is_cred_expire_plus_one_second() -> None:
    conf = ("AuthAltTypes            = (null)\n"
            "AuthInfo                = socket=/run/munge/munge.socket.2,cred_expire=30\n"
            "AuthType                = auth/munge\n")
    assert requeue_hold_s(conf) == 31.0
    assert requeue_hold_s("AuthInfo                = cred_expire=5,socket=/tmp/m.sock\n") == 6.0
    assert requeue_hold_s("AuthInfo                = (null)\n") == DEFAULT_CRED_EXPIRE_S + 1
    assert requeue_hold_s("AuthInfo = socket=/x,my_cred_expire=9\n") == DEFAULT_CRED_EXPIRE_S + 1
    assert requeue_hold_s("") == DEFAULT_CRED_EXPIRE_S + 1


def test_drain_reason_always_names_the_action_on_one_short_line() -> None:
    assert clean_reason("failslow act-1: slow\nrank 3", "act-1") == "failslow act-1: slow rank 3"
    assert clean_reason("rank 3 slow", "act-1") == "failslow act-1: rank 3 slow"
    long = clean_reason("x" * 500 + " act-1", "act-1", limit=60)
    assert len(long) == 60 and reason_names(long, "act-1")
    assert reason_names("failslow act-12: slow", "act-1") is False
