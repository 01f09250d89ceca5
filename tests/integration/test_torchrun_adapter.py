"""The torchrun adapter on a real elastic job: torchrun agents for two "nodes" on this machine, gloo workers.

One job, two restarts: first n2 is excluded onto the spare n3 (with a checkpoint asked for first), then n3
is excluded with no spare left, so the job goes on with n1 alone. Each time the test reads the job's own
progress lines to check what the adapter claims: the agent is gone, the workers restarted (their agent's
restart count went up), the steps went on from the checkpoint rather than from 0, on the expected nodes,
and the pause and the recomputed steps match the lines.

The agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch 2.13's default shared store a new
agent (the spare) hangs in the rendezvous and the job dies after 60 s (see the adapter's docstring).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from failslow_cli.stack.processes import free_port
from remediator.adapters import adapter_class
from remediator.adapters.base import ActionOutcome, ActionRequest, AdapterError, ConfigError
from remediator.adapters.torchrun import (
    RESTARTS_KEPT,
    Adapter,
    first_start_s,
    parse_progress,
    past_restarts,
    summarise,
)
from tests.integration.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420), pytest.mark.testbed]

JOB = "trjob"
SCRIPT = Path(__file__).with_name("torchrun_job.py")
TORCHRUN = Path(sys.executable).parent / "torchrun"
# Short heartbeats and last call keep each re-rendezvous to a few seconds instead of 45.
RDZV_CONF = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3"
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO", "OMP_NUM_THREADS": "1",
             "PYTHONUNBUFFERED": "1"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


class Cluster:
    """Agents of one torchrun job on this machine, their logs, and the job's progress lines."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.port = free_port()
        (run_dir / "agents").mkdir(parents=True)
        (run_dir / "logs").mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: dict[str, float] = {}

    def agent_argv(self, host: bool) -> list[str]:
        return [str(TORCHRUN), "--nnodes=1:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={JOB}", "--max-restarts=5",
                "--monitor-interval=0.2", f"--rdzv-conf=is_host={int(host)},{RDZV_CONF}",
                str(SCRIPT), "--run-dir", str(self.run_dir), "--step-time", "0.2", "--ckpt-every", "10"]

    def spare_command(self) -> list[str]:
        """What the adapter runs to start a spare agent: the same agent, the node name through the env."""
        env = [f"{k}={v}" for k, v in AGENT_ENV.items()]
        return ["/usr/bin/env", "FAILSLOW_NODE={spare}", *env, *self.agent_argv(host=False)]

    def start(self, node: str, host: bool) -> None:
        # Only n1 hosts the c10d store (is_host): the agents excluded later must not take it with them.
        with open(self.run_dir / "logs" / f"{node}.log", "wb") as log:
            self.started[node] = time.time()
            p = subprocess.Popen(self.agent_argv(host), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, **AGENT_ENV, "FAILSLOW_NODE": node})
        self.procs[node] = p
        (self.run_dir / "agents" / f"{node}.pid").write_text(f"{p.pid}\n")

    def pid(self, node: str) -> int | None:
        try:
            return int((self.run_dir / "agents" / f"{node}.pid").read_text())
        except FileNotFoundError:
            return None

    def progress(self) -> list[dict[str, Any]]:
        path = self.run_dir / "progress.jsonl"
        if not path.exists():
            return []
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.endswith("}")]

    def report(self) -> str:
        """The agents' logs and the progress tail, for a failure message."""
        out = []
        for log in sorted((self.run_dir / "logs").glob("*.log")):
            lines = [ln for ln in log.read_text(errors="replace").splitlines()
                     if not ln.startswith(("frame #", "  ")) and "api.py:254]" not in ln]
            out.append(f"--- {log.name} (last 25 lines)\n" + "\n".join(lines[-25:]))
        prog = self.run_dir / "progress.jsonl"
        if prog.exists():
            out.append("--- progress (last 8 lines)\n" + "\n".join(prog.read_text().splitlines()[-8:]))
        return "\n".join(out)

    def stop_all(self) -> None:
        """Stop every agent (ours and the adapter's spare), then any worker of this run left behind."""
        pids = {p.pid for p in self.procs.values()}
        pids |= {pid for n in ("n1", "n2", "n3") if (pid := self.pid(n)) is not None}
        for pid in pids:
            if _alive(pid):  # SIGTERM first: an agent then stops its own workers
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # every agent leads its own session
        for p in self.procs.values():
            p.wait(timeout=10)
        # Workers run in sessions of their own; a killed agent can leave one behind. This run's workers are
        # the processes whose command line names this run's (unique) directory.
        needle = str(self.run_dir).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "run")
    try:
        yield c
    finally:
        c.stop_all()


def _options(c: Cluster, **more: Any) -> dict[str, Any]:
    return {"pid_file": "{run_dir}/agents/{node}.pid", "progress_file": "{run_dir}/progress.jsonl",
            "journal": "{run_dir}/remediator/{action}.json", "rdzv_host_node": "n1",
            "resume_timeout_s": 150, "stop_timeout_s": 30, "poll_interval_s": 0.2, **more}


def _attempts(lines: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for r in lines:
        if r["attempt"] not in out:
            out.append(r["attempt"])
    return out


def _check_restart(c: Cluster, before: list[dict[str, Any]], action_id: str, outcome: ActionOutcome, stopped: str,
                   nodes: set[str], restart_of_n1: int) -> dict[str, Any]:
    """Checks one restart against the progress lines; returns facts about the new worker group."""
    rep = c.report
    lines = c.progress()
    old = {r["attempt"] for r in before}
    new = [r for r in lines if r["attempt"] not in old]
    assert new, rep()
    groups = _attempts(new)
    final = [r for r in new if r["attempt"] == groups[-1]]
    first_new = new[0]
    last_old = max(r["step"] for r in lines if r["attempt"] in old)
    # The agent is gone; the job trains again on the expected nodes, continuing from the checkpoint.
    assert c.procs.get(stopped) is None or c.procs[stopped].wait(timeout=5) is not None
    assert not _alive(c.pid(stopped) or 0), rep()
    assert {r["node"] for r in final} == nodes, rep()
    assert {r["world"] for r in final} == {len(nodes)}, rep()
    assert first_new["step"] > 10, rep()  # from a checkpoint, not from step 0
    assert max(r["restart"] for r in final if r["node"] == "n1") == restart_of_n1, rep()
    # What the adapter measured is what the lines say.
    assert outcome.ok, (outcome, rep())
    res = outcome.result
    assert res["stopped"] == [stopped] and res["killed"] == [], outcome
    assert sorted(res["nodes_after"]) == sorted(nodes), outcome
    assert res["world_after"] == len(nodes), outcome
    assert res["resumed_step"] == first_new["step"], outcome
    assert res["resumed_from"] == first_new["step"] - 1, outcome
    assert res["last_step_before"] == last_old, outcome
    assert res["restart_counts"]["n1"] == restart_of_n1, outcome
    if len(groups) == 1:
        assert outcome.iterations_lost == max(0, last_old - (first_new["step"] - 1)), (outcome, rep())
    else:  # the spare came a round late: one more restart, whose recomputed steps add up
        assert outcome.iterations_lost is not None and outcome.iterations_lost >= last_old - first_new["step"] + 1
    journal = json.loads((c.run_dir / "remediator" / f"{action_id}.json").read_text())
    assert journal["phase"] == "done", journal
    # The pause runs from the stop (or the stopped group's last line, if one came later) to the first new line,
    # plus the same for each further restart when the spare came late.
    stalled_from = max([journal["t_stop"]] + [r["time"] for r in lines if r["attempt"] in old])
    gap = first_new["time"] - stalled_from
    assert outcome.pause_s is not None, outcome
    if len(groups) == 1:
        assert outcome.pause_s == pytest.approx(gap, abs=1e-6), (outcome, gap)
    else:
        assert gap - 1e-6 <= outcome.pause_s <= final[0]["time"] - journal["t_stop"], (outcome, gap)
    assert 0.5 < outcome.pause_s < 150, outcome
    return {"first": first_new, "final": final, "groups": groups, "last_old": last_old, "journal": journal}


def _run(adapter: Adapter, action_id: str, **params: Any) -> ActionOutcome:
    t0 = time.monotonic()
    out = adapter.execute(ActionRequest(id=action_id, job=JOB, strategy="restart", params=params,
                                        reason="test"))
    print(f"{action_id}: {time.monotonic() - t0:.1f} s, pause {out.pause_s}, lost {out.iterations_lost}: "
          f"{out.detail}")
    return out


def test_restart_excluding_a_node_onto_a_spare_then_without_one(cluster: Cluster) -> None:
    c, labels = cluster, {"run_dir": str(cluster.run_dir)}
    t_start = time.monotonic()
    c.start("n1", host=True)
    c.start("n2", host=False)
    # Both nodes train and a periodic checkpoint (every 10 steps) exists.
    wait_for(lambda: {r["node"] for r in c.progress() if r["world"] == 2 and r["step"] >= 12} == {"n1", "n2"},
             150, "n1 and n2 training past step 12", every=0.3, on_timeout=c.report)
    print(f"job up after {time.monotonic() - t_start:.1f} s")

    spare = _options(c, spare_nodes=["n3"], spare_command=c.spare_command(), spare_log="{run_dir}/logs/{spare}.log",
                     spare_join_timeout_s=90, checkpoint_request="{run_dir}/checkpoint-now",
                     checkpoint_ack="{run_dir}/checkpoint-now.ack", checkpoint_timeout_s=60)
    adapter = adapter_class("torchrun")(JOB, labels, spare)
    assert isinstance(adapter, Adapter) and adapter.capabilities() == frozenset({"restart"})
    info = adapter.info()
    assert info.nodes == ["n1", "n2"] and info.spare_nodes == ["n3"], info
    assert info.placement is not None and sorted(info.placement) == [0, 1], info
    # No restart yet: a restart is expected to cost the job's own start-up, from the agents' start to the
    # first worker group's first line.
    lines = c.progress()
    assert not [r for r in lines if r["attempt"] != lines[0]["attempt"]], c.report()
    startup = min(r["time"] for r in lines) - max(c.started.values())
    assert info.costs == {"restart": pytest.approx(startup, abs=0.25)}, (info, startup)
    assert info.extra["startup_s"] == info.costs["restart"], info
    pids = {n: c.pid(n) for n in ("n1", "n2")}

    # Refusals: a node the job does not have, the store host, another strategy. Nothing is touched.
    with pytest.raises(AdapterError, match="no running agent on n9") as e:
        adapter.execute(ActionRequest(id="bad-1", job=JOB, strategy="restart", params={"exclude_nodes": ["n9"]}))
    assert not e.value.transient
    with pytest.raises(AdapterError, match="rendezvous store"):
        adapter.execute(ActionRequest(id="bad-2", job=JOB, strategy="restart", params={"exclude_nodes": ["n1"]}))
    with pytest.raises(AdapterError, match="only restarts"):
        adapter.execute(ActionRequest(id="bad-3", job=JOB, strategy="rebalance", params={"counts": [1, 1]}))
    assert all(_alive(pid or 0) for pid in pids.values()) and not (c.run_dir / "checkpoint-now").exists()
    # An action that never ran is reported as not carried out, and recovering it does nothing either.
    never = adapter.recover(ActionRequest(id="never", job=JOB, strategy="restart", params={"exclude_nodes": ["n2"]}))
    assert never is not None and not never.ok and never.result["carried_out"] is False, never
    # A stop command that fails is an error carrying its stderr; the job is left as it was.
    failing = Adapter(JOB, labels, {"pid_file": "{run_dir}/agents/{node}.pid", "stop_command": [
        sys.executable, "-c", "import sys; sys.exit('no agent of ' + sys.argv[1] + ' here')", "{node}"]})
    with pytest.raises(AdapterError, match="no agent of n2 here"):
        failing.execute(ActionRequest(id="bad-5", job=JOB, strategy="restart", params={"exclude_nodes": ["n2"]}))
    assert all(_alive(pid or 0) for pid in pids.values())

    # 1. Exclude n2 (by its rank, as the detector names it), checkpoint first, onto the spare n3.
    rank_of_n2 = next(r["rank"] for r in reversed(c.progress()) if r["node"] == "n2")
    before = c.progress()
    out1 = _run(adapter, "act-1", exclude_ranks=[rank_of_n2])
    f1 = _check_restart(c, before, "act-1", out1, "n2", {"n1", "n3"}, restart_of_n1=1)
    print(f"start-up {info.costs['restart']:.1f} s before it; the restart paused {out1.pause_s:.1f} s")
    ack = json.loads((c.run_dir / "checkpoint-now.ack").read_text())
    assert ack["id"] == "act-1" and out1.result["checkpoint_step"] == ack["step"], (ack, out1)
    # The job resumed from the checkpoint it was asked for (or a later periodic one), so only the steps
    # between that checkpoint and the stop were recomputed.
    assert f1["first"]["step"] - 1 >= ack["step"] and out1.iterations_lost is not None, (ack, out1)
    assert out1.iterations_lost <= f1["last_old"] - ack["step"], (ack, out1)
    assert out1.result["spares_started"] == ["n3"] and out1.result["spare_joined"] is True, out1
    assert _alive(c.pid("n3") or 0), c.report()
    info = adapter.info()
    assert info.nodes == ["n1", "n3"] and info.spare_nodes == [], info
    assert info.extra["last_step"] >= f1["first"]["step"], info

    # recover() in a "restarted remediator" (a fresh adapter) reports the same outcome and acts no more.
    pids = {n: c.pid(n) for n in ("n1", "n3")}
    again = adapter_class("torchrun")(JOB, labels, spare).recover(
        ActionRequest(id="act-1", job=JOB, strategy="restart", params={"exclude_ranks": [rank_of_n2]}))
    assert again is not None and again.to_json() == out1.to_json(), (again, out1)
    groups = _attempts(c.progress())
    time.sleep(2.0)
    assert _attempts(c.progress()) == groups, c.report()  # no new restart
    assert {n: c.pid(n) for n in ("n1", "n3")} == pids and all(_alive(p or 0) for p in pids.values())
    assert not (c.run_dir / "checkpoint-now").exists()
    # Executing the same action id again does not restart anything either.
    assert adapter.execute(ActionRequest(id="act-1", job=JOB, strategy="restart",
                                         params={"exclude_nodes": ["n2"]})).to_json() == out1.to_json()

    # 2. Exclude n3 with no spare and no checkpoint request: n1 goes on alone, from the periodic checkpoint.
    # This time through a stop command (here one that signals the pid in the node's pid file, as an ssh
    # command would on the node), the pid file telling when the agent is gone.
    wait_for(lambda: max(r["step"] for r in c.progress()) >= f1["first"]["step"] + 12, 60,
             "n1 and n3 past another periodic checkpoint", every=0.3, on_timeout=c.report)
    stop = [sys.executable, "-c", "import os, signal, sys; os.kill(int(open(sys.argv[1]).read()), signal.SIGTERM)",
            "{run_dir}/agents/{node}.pid"]
    plain = adapter_class("torchrun")(JOB, labels, _options(c, stop_command=stop))
    before = c.progress()
    out2 = _run(plain, "act-2", exclude_nodes=["n3"])
    f2 = _check_restart(c, before, "act-2", out2, "n3", {"n1"}, restart_of_n1=2)
    assert out2.result["checkpoint_step"] is None and out2.result["spares_started"] == [], out2
    assert (f2["first"]["step"] - 1) % 10 == 0, f2["first"]  # a periodic checkpoint
    assert plain.info().nodes == ["n1"]
    # The same restart as the progress lines alone tell it, which is what the next one is expected to cost
    # (JobInfo.costs): the same steps recomputed, and a pause from the old group's last line (not from the
    # stop, which the lines do not show) to the new group's first.
    keys = {k: k for k in ("step", "attempt", "node", "rank", "world", "restart", "time")}
    history = past_restarts(parse_progress((c.run_dir / "progress.jsonl").read_bytes(), keys, 0.0)[0])
    print(f"restarts the progress lines show: {history}, the adapter measured {out2.pause_s} s")
    assert history[-1].iterations_lost == out2.iterations_lost, (history, out2)
    old = {r["attempt"] for r in before}
    lines = c.progress()
    gap = min(r["time"] for r in lines if r["attempt"] == f2["groups"][0]) \
        - max(r["time"] for r in lines if r["attempt"] in old)
    assert history[-1].pause_s == pytest.approx(gap), (history, gap)
    assert plain.info().costs == {"restart": pytest.approx(
        statistics.median(h.cost_s for h in history[-RESTARTS_KEPT:]))}
    # Had the remediator died after stopping n3 (journal left at "stopped"), recover() would have measured
    # the same restart from the progress lines.
    cut = {k: v for k, v in f2["journal"].items() if k != "outcome"} | {"id": "act-2b", "phase": "stopped"}
    (c.run_dir / "remediator" / "act-2b.json").write_text(json.dumps(cut))
    late = plain.recover(ActionRequest(id="act-2b", job=JOB, strategy="restart", params={"exclude_nodes": ["n3"]}))
    assert late is not None and late.ok and late.result["recovered"] is True, late
    assert late.result["nodes_after"] == ["n1"] and late.iterations_lost == out2.iterations_lost, (late, out2)
    assert late.pause_s == pytest.approx(out2.pause_s), (late, out2)
    # Now nothing is left to exclude onto: n1 is the last node (and the store host).
    with pytest.raises(AdapterError):
        plain.execute(ActionRequest(id="bad-4", job=JOB, strategy="restart", params={"exclude_nodes": ["n1"]}))
    print(f"whole test {time.monotonic() - t_start:.1f} s")


@pytest.mark.parametrize("options, message", [
    ({}, "pid_file' or 'stop_command"),
    ({"pid_file": "/x/{node}.pid", "bogus": 1}, "unknown torchrun adapter option"),
    ({"pid_file": "/x/agent.pid"}, "must contain {node}"),
    ({"pid_file": "/x/{node}.pid", "spare_nodes": ["n3"]}, "go together"),
    ({"pid_file": "/x/{node}.pid", "checkpoint_request": "/x/now"}, "go together"),
    ({"pid_file": "/x/{nodes}.pid"}, "no value for {nodes}"),
    ({"stop_command": ["ssh", "{node}", "pkill", "{whom}"]}, "no value for {whom}"),
    ({"stop_command": "ssh {node} pkill torchrun"}, "must be list"),
    ({"stop_command": []}, "must name a program"),
    ({"pid_file": "/x/{node}.pid", "stop_timeout_s": -1}, "positive"),
    ({"pid_file": "/x/{node}.pid", "resume_timeout_s": True}, "boolean"),
    ({"pid_file": "/x/{node}.pid", "progress_keys": {"stepp": "s"}}, "progress_keys"),
    ({"pid_file": "/x/{node}.pid", "journal": "/x/journal.json"}, "must contain {action}"),
    ({"pid_file": "/x/{node}.pid", "spare_nodes": ["n3", "n3"], "spare_command": ["x"]}, "twice"),
])
def test_bad_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        Adapter(JOB, {}, options)


def _line(step: int, attempt: float, node: str, t: float, rank: int = 0, restart: int = 0) -> bytes:
    return json.dumps({"step": step, "attempt": attempt, "node": node, "rank": rank, "restart": restart,
                       "world": 2, "time": t}).encode() + b"\n"


def test_progress_summary_adds_up_every_restart_after_the_stop() -> None:
    keys = {k: k for k in ("step", "attempt", "node", "rank", "world", "restart", "time")}
    data = b"".join([
        _line(17, 1.0, "n1", 100.2),                 # a late line of the stopped group (attempt 1.0)
        b"not json\n",                               # other output is skipped
        _line(11, 2.0, "n1", 110.0, restart=1),      # n1 alone from checkpoint 10: 7 steps recomputed
        _line(12, 2.0, "n1", 110.3, restart=1),
        _line(13, 2.0, "n1", 110.6, restart=1),
        _line(11, 3.0, "n1", 120.0, restart=1),      # the spare joins a round late: back to 10 once more
        _line(11, 3.0, "n3", 120.0, rank=1),
        _line(12, 3.0, "n3", 120.2, rank=1),
        b'{"step": 13, "attempt": 3.0',               # being written: left for the next read
    ])
    recs, used = parse_progress(data, keys, seen_at=999.0)
    assert used == data.rindex(b"\n") + 1 and len(recs) == 7
    s = summarise(recs, ["1.0"], last_step_before=16, t_stop=100.0)
    assert [a.first_step for a in s.attempts] == [11, 11] and s.last_step_before == 17
    assert s.latest is not None and s.latest.nodes == ["n1", "n3"] and s.latest.ranks == {0: "n1", 1: "n3"}
    assert s.iterations_lost == 7 + 3
    assert s.pause_s == pytest.approx((110.0 - 100.2) + (120.0 - 110.6))
    assert s.settled()
    # Before any new start, nothing resumed; with lines lacking their own time, the read time stands in.
    assert not summarise(recs[:1], ["1.0"], 16, 100.0).resumed
    bare, _ = parse_progress(b'{"step": 3}\n', keys, seen_at=42.0)
    assert bare[0].time == 42.0 and bare[0].attempt is None


def test_without_a_restart_seen_a_restart_is_expected_to_cost_the_jobs_start_up(tmp_path: Path) -> None:
    keys = {k: k for k in ("step", "attempt", "node", "rank", "world", "restart", "time")}

    def recs(*lines: bytes) -> list[Any]:
        return parse_progress(b"".join(lines), keys, 0)[0]

    first = [_line(1, 1.0, "n1", 112.0), _line(1, 1.0, "n2", 112.3, rank=1), _line(2, 1.0, "n1", 112.5)]
    # from the later of the two agents' starts to the group's first line, whatever order the lines came in
    assert first_start_s(recs(*reversed(first)), {"n1": 100.0, "n2": 101.0}) == pytest.approx(11.0)
    # an agent of the first group gone or replaced since (started after its first line): no estimate
    assert first_start_s(recs(*first), {"n1": 100.0}) is None
    assert first_start_s(recs(*first), {"n1": 100.0, "n2": 130.0}) is None
    # the earliest lines are not the agents' first start (a restart count, e.g. a truncated file): none
    assert first_start_s(recs(_line(11, 2.0, "n1", 112.0, restart=1)), {"n1": 100.0}) is None
    assert first_start_s([], {"n1": 100.0}) is None

    # The adapter reads the agents' start from /proc (a stand-in agent process here) and the head of the files.
    agent = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "n1.pid").write_text(f"{agent.pid}\n")
        adapter = Adapter(JOB, {}, {"pid_file": str(tmp_path / "{node}.pid"), "pid_match": ["sleep"],
                                    "progress_file": str(tmp_path / "progress.jsonl")})
        assert adapter.info().costs == {}  # no lines yet
        t0 = time.time()
        (tmp_path / "progress.jsonl").write_bytes(_line(1, 1.0, "n1", t0 + 4.0) + _line(2, 1.0, "n1", t0 + 4.5))
        info = adapter.info()
        assert info.costs == {"restart": pytest.approx(4.0, abs=0.2)}, info
        assert info.extra["startup_s"] == info.costs["restart"], info
        # once a restart shows in the lines, what it cost is the estimate
        with (tmp_path / "progress.jsonl").open("ab") as out:
            out.write(_line(2, 2.0, "n1", t0 + 10.5, restart=1) + _line(3, 2.0, "n1", t0 + 11.0, restart=1))
        assert adapter.info().costs == {"restart": pytest.approx(6.0 + 1 * 0.5)}
        assert "startup_s" not in adapter.info().extra
    finally:
        agent.kill()
        agent.wait()


def test_past_restarts_cost_their_pause_and_the_steps_recomputed(tmp_path: Path) -> None:
    keys = {k: k for k in ("step", "attempt", "node", "rank", "world", "restart", "time")}
    rank0 = [_line(s, 1.0, "n1", 100.0 + 0.5 * (s - 1)) for s in range(1, 18)]     # 0.5 s a step, to 17 at 108
    rank1 = [_line(s, 1.0, "n2", 100.1 + 0.5 * (s - 1), rank=1) for s in range(1, 17)]
    again = [_line(11, 2.0, "n1", 130.0, restart=1), _line(12, 2.0, "n1", 130.4, restart=1),   # from 10, at 0.4
             _line(13, 2.0, "n1", 130.8, restart=1),
             _line(11, 3.0, "n1", 150.0, restart=2), _line(11, 3.0, "n3", 150.1, rank=1)]
    # two files (one per node), read in any order: the restarts come out in the order they happened
    (tmp_path / "n2.jsonl").write_bytes(b"".join(rank1))
    (tmp_path / "n1.jsonl").write_bytes(b"".join(rank0 + again[:3]) + b"".join(again[3:]))
    recs = [r for f in sorted(tmp_path.iterdir(), reverse=True) for r in parse_progress(f.read_bytes(), keys, 0)[0]]
    got = past_restarts(recs)
    assert len(got) == 2, got
    assert (got[0].iterations_lost, got[1].iterations_lost) == (7, 3), got
    assert got[0].pause_s == pytest.approx(130.0 - 108.0) and got[0].step_s == pytest.approx(0.5), got
    assert got[1].pause_s == pytest.approx(150.0 - 130.8) and got[1].step_s == pytest.approx(0.4), got
    assert got[0].cost_s == pytest.approx(22.0 + 7 * 0.5) and got[1].cost_s == pytest.approx(19.2 + 3 * 0.4)
    # no attempt to tell groups apart, or a single group: nothing to learn from
    assert past_restarts(parse_progress(b'{"step": 1, "time": 1}\n{"step": 2, "time": 2}\n', keys, 0)[0]) == []
    assert past_restarts(parse_progress(b"".join(rank0), keys, 0)[0]) == []

    # the adapter's estimate: the median of the latest restarts the progress files show
    adapter = Adapter(JOB, {}, {"pid_file": str(tmp_path / "{node}.pid"), "progress_file": str(tmp_path / "*.jsonl")})
    assert adapter.info().costs == {"restart": pytest.approx(statistics.median([got[0].cost_s, got[1].cost_s]))}
    late = b"".join(_line(11, 4.0 + k, "n1", 200.0 + 10 * k, restart=3 + k) for k in range(RESTARTS_KEPT))
    with (tmp_path / "n1.jsonl").open("ab") as out:
        out.write(late)  # each 10 s after the line before it (a one-line group: no pace to cost its step at)
    assert adapter.info().costs == {"restart": pytest.approx(10.0)}
    for path in tmp_path.glob("*.jsonl"):
        path.unlink()
    assert adapter.info().costs == {}
