"""Slurm adapter: restart a batch job away from its fail-slow nodes by draining them and requeueing the job.

Slurm has no spare pool in our sense and no micro-batch knob, so the only strategy is ``restart``: each bad
node is drained with a reason naming the action, the job is requeued (Slurm starts the batch script again;
the job resumes from its own checkpoint) and its ``ExcNodeList`` gets the bad nodes, so that it is not
placed on them even if an administrator resumes a node early. The adapter then waits until the job runs
again and reports the pause, measured from the requeue to Slurm's new ``StartTime``.

Before the remediator has measured a restart, :meth:`Adapter.info` gives the planner Slurm's own estimate
of one (``JobInfo.costs["restart"]``): the requeue hold (Slurm keeps a requeued batch job from starting for
``cred_expire`` + 1 seconds, ``AuthInfo`` in ``scontrol show config``, 120 s by default) plus the wait this
job had for nodes once it was eligible, its current run's ``StartTime - EligibleTime``. On a job that was
requeued before, that sum is its last requeue's pause from the moment the job was back in the queue (Slurm
sets ``SubmitTime`` then and ``EligibleTime`` a hold later). It leaves out the time Slurm takes to stop the
running job first (the batch script killed, the job COMPLETING: 0-3.4 s in the test cluster) and the job's
own start-up (loading the checkpoint), neither of which the job's record keeps: a lower bound, which the
first measured restart replaces.

Options (``Adapter(job, labels, options)``):

* ``job_id_label`` (str, ``"slurm_job_id"``): alert or job label carrying the Slurm job id; when absent
  the job is found by name.
* ``job_name`` (template, ``"{job}"``): the Slurm job name; exactly one running job must carry it.
* ``node_map`` (dict str→str, identity): node label of the job's series → Slurm node name.
* ``drain_reason`` (template, ``"failslow {action}: {reason}"``): fields ``{job}``, the job's labels,
  ``{action}``, ``{reason}``, ``{nodes}`` and ``{slurm_job_id}``. The action id is always kept in the
  reason (prefixed if the template leaves it out) because :meth:`Adapter.recover` looks for it.
* ``ranks_per_node`` (int, unset): lets ``exclude_ranks`` name nodes (Slurm's default block placement:
  rank r on the job's node r // ranks_per_node); without it ranks alone cannot be acted on.
* ``wait_running_s`` (number, 300): how long :meth:`Adapter.execute` waits for the job to run again;
  0 returns right after the requeue with the pause unknown.
* ``poll_interval_s`` (number, 1), ``command_timeout_s`` (number, 30).
* ``bin_dir`` (str, unset: ``PATH``): directory of ``scontrol``, ``squeue`` and ``sinfo``.
* ``slurm_conf`` (str, unset): passed as ``SLURM_CONF`` to every command; ``env`` (dict str→str): more
  environment for the commands.

Idempotency: before touching anything the adapter writes ``failslow:<action id>:restarts=<n>`` into the
job's ``AdminComment`` (an administrator's field, overwritten), where n is the job's restart count
before the action. After a remediator crash :meth:`Adapter.recover` compares that count with the job's
current one and reads the drain reasons to tell what happened, without acting again.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from remediator.adapters.base import (
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    option,
    render,
)

OPTIONS = frozenset({"job_id_label", "job_name", "node_map", "drain_reason", "ranks_per_node", "wait_running_s",
                     "poll_interval_s", "command_timeout_s", "bin_dir", "slurm_conf", "env"})
COMMANDS = ("scontrol", "squeue", "sinfo")
MAX_REASON = 200  # Slurm stores any length, but sinfo and people read one line
# States from which a job does not come back by itself (squeue's long names).
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                      "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
# Node states (sinfo %T without its flag suffix) in which a node can take a job, now or once freed.
USABLE = frozenset({"idle", "allocated", "mixed", "completing", "planned", "reserved"})
# Client errors that say "the controller or munge is not answering now", not "no".
TRANSIENT = re.compile(r"unable to contact slurm controller|socket timed out|connection refused|connection timed out"
                       r"|zero bytes were transmitted|communication connection failure|standby mode"
                       r"|resource temporarily unavailable|munge (en|de)code failed|transport endpoint", re.I)
_KEY = re.compile(r"(?<!\S)([A-Za-z][\w/:]*)=")
_MARK = re.compile(r"failslow:(?P<id>\S+?):restarts=(?P<n>\d+)")
_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_UNSET = frozenset({"", "(null)", "None", "Unknown", "N/A"})
DEFAULT_CRED_EXPIRE_S = 120  # Slurm's default cred_expire (AuthInfo), which sets the requeue hold
_CRED_EXPIRE = re.compile(r"(?:^|,)\s*cred_expire=(\d+)")


def parse_fields(line: str) -> dict[str, str]:
    """The ``Key=value`` pairs of one ``scontrol show … -o`` line (values may hold spaces)."""
    keys = list(_KEY.finditer(line))
    out = {}
    for m, nxt in zip(keys, [*keys[1:], None], strict=True):
        out[m.group(1)] = line[m.end():nxt.start() if nxt else len(line)].strip()
    return out


def parse_time(value: str) -> float | None:
    """Epoch seconds of a Slurm timestamp (``2026-01-31T12:00:00``, local time); None when unset."""
    if value in _UNSET:
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def requeue_hold_s(config: str) -> float:
    """How long Slurm holds a requeued batch job before it may start, from ``scontrol show config`` output:
    ``cred_expire`` (``AuthInfo``; 120 s when not set) plus one second."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AuthInfo":
            m = _CRED_EXPIRE.search(value.strip())
            if m:
                return float(int(m.group(1)) + 1)
    return float(DEFAULT_CRED_EXPIRE_S + 1)


def marker(action_id: str, restarts: int) -> str:
    """The AdminComment that ties a job to an action and remembers its restart count before it."""
    return f"failslow:{action_id}:restarts={restarts}"


def parse_marker(comment: str) -> tuple[str, int] | None:
    """(action id, restart count before it) from an AdminComment, or None."""
    m = _MARK.search(comment)
    return (m.group("id"), int(m.group("n"))) if m else None


def reason_names(reason: str, action_id: str) -> bool:
    """Whether a drain reason names `action_id` as a whole word (so action 1 does not match action 12)."""
    return re.search(rf"(?<![\w-]){re.escape(action_id)}(?![\w-])", reason) is not None


def clean_reason(text: str, action_id: str, limit: int = MAX_REASON) -> str:
    """A drain reason on one line, at most `limit` characters, always naming `action_id`."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).replace('"', "'").split())
    if not reason_names(text, action_id):
        text = f"failslow {action_id}: {text}".rstrip(": ")
    if len(text) > limit:
        head = f"failslow {action_id}: "
        text = text[:limit] if reason_names(text[:limit], action_id) else (head + text)[:limit]
    return text


@dataclass(frozen=True)
class SlurmJob:
    """One ``scontrol show job`` record, with the fields the adapter uses."""

    job_id: str
    name: str
    state: str
    reason: str
    restarts: int
    node_list: str
    exc_node_list: str
    partition: str
    num_nodes: int
    start_time: float | None
    eligible_time: float | None
    requeue: bool
    batch: bool
    admin_comment: str

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> SlurmJob:
        """Build from :func:`parse_fields` output."""
        def num(key: str) -> int:
            m = re.match(r"\d+", f.get(key, ""))
            return int(m.group()) if m else 0

        def text(key: str) -> str:
            v = f.get(key, "")
            return "" if v in _UNSET else v

        return cls(job_id=f.get("JobId", ""), name=f.get("JobName", ""), state=f.get("JobState", ""),
                   reason=text("Reason"), restarts=num("Restarts"), node_list=text("NodeList"),
                   exc_node_list=text("ExcNodeList"), partition=text("Partition"), num_nodes=num("NumNodes"),
                   start_time=parse_time(f.get("StartTime", "")),
                   eligible_time=parse_time(f.get("EligibleTime", "")), requeue=f.get("Requeue") == "1",
                   batch=f.get("BatchFlag") == "1", admin_comment=text("AdminComment"))


class Adapter:
    """Drains a Slurm job's bad nodes and requeues the job elsewhere (capability ``restart``)."""

    kind: ClassVar[str] = "slurm"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any], *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        """Check the options; nothing is run until a method is called.

        Args:
            job: The training job (``job`` label).
            labels: The job's configured labels (template fields).
            options: See the module docstring.
            clock: Wall clock (Slurm's timestamps are wall time).
            sleep: Waiting between polls.

        Raises:
            ConfigError: an unknown option, a wrong type or value, a template with an unknown field, a
                missing binary or Slurm config file.
        """
        unknown = set(options) - OPTIONS
        if unknown:
            raise ConfigError(f"slurm adapter: unknown option(s) {sorted(unknown)} (known: {sorted(OPTIONS)})")
        self.job, self.labels = job, dict(labels)
        self._clock, self._sleep = clock, sleep
        self.job_id_label: str = option(options, "job_id_label", str, "slurm_job_id")
        self.job_name_template: str = option(options, "job_name", str, "{job}")
        self.drain_template: str = option(options, "drain_reason", str, "failslow {action}: {reason}")
        self.node_map: dict[str, str] = _str_dict(option(options, "node_map", dict, {}), "node_map")
        if len(set(self.node_map.values())) != len(self.node_map):
            raise ConfigError("option 'node_map' maps two nodes to the same Slurm node")
        self._reverse = {v: k for k, v in self.node_map.items()}
        rpn = option(options, "ranks_per_node", (int, type(None)), None)
        if rpn is not None and rpn < 1:
            raise ConfigError("option 'ranks_per_node' must be >= 1")
        self.ranks_per_node: int | None = rpn
        self.wait_running_s = float(_non_negative(options, "wait_running_s", 300.0))
        self.poll_interval_s = float(_positive(options, "poll_interval_s", 1.0))
        self.command_timeout_s = float(_positive(options, "command_timeout_s", 30.0))
        bin_dir = option(options, "bin_dir", (str, type(None)), None)
        self._bin: dict[str, str] = {}
        for cmd in COMMANDS:
            path = str(Path(bin_dir) / cmd) if bin_dir else cmd
            if bin_dir and not (Path(path).is_file() and os.access(path, os.X_OK)):
                raise ConfigError(f"option 'bin_dir': no executable {path}")
            self._bin[cmd] = path
        env = dict(os.environ)
        env.update(_str_dict(option(options, "env", dict, {}), "env"))
        conf = option(options, "slurm_conf", (str, type(None)), None)
        if conf is not None:
            if not Path(conf).is_file():
                raise ConfigError(f"option 'slurm_conf': no file {conf}")
            env["SLURM_CONF"] = conf
        self._env = env
        self._hold_s: float | None = None  # the requeue hold, read from the controller once
        # Templates are checked now, with every field they may use at action time.
        self.job_name = render(self.job_name_template, job, self.labels)
        render(self.drain_template, job, self.labels, action="a", reason="r", nodes="n", slurm_job_id="1")

    # --- the contract ---

    def capabilities(self) -> frozenset[str]:
        """Only ``restart``: Slurm can move a job off nodes, but cannot change its micro-batches."""
        return frozenset({"restart"})

    def info(self) -> JobInfo:
        """The job's nodes (as the job's series name them), its Slurm id, state and partition, and the
        expected cost of a restart (see the module docstring) once the job has run.

        Raises:
            AdapterError: the job cannot be found or Slurm does not answer.
        """
        job = self._find(self.labels, running_only=False)
        slurm_nodes = self._hostnames(job.node_list)
        layout = placement = None
        if self.ranks_per_node is not None and slurm_nodes:
            layout = {"dp": None, "pp": None, "tp": None, "ranks_per_node": self.ranks_per_node}
            placement = [r // self.ranks_per_node for r in range(len(slurm_nodes) * self.ranks_per_node)]
        costs = {}
        if job.state == "RUNNING" and job.start_time is not None and job.eligible_time is not None:
            costs["restart"] = self._requeue_hold() + max(0.0, job.start_time - job.eligible_time)
        return JobInfo(layout=layout, placement=placement, nodes=[self._reverse.get(n, n) for n in slurm_nodes],
                       costs=costs,
                       extra={"slurm_job_id": job.job_id, "state": job.state, "partition": job.partition,
                              "restarts": job.restarts, "slurm_nodes": slurm_nodes,
                              "excluded_nodes": self._hostnames(job.exc_node_list)})

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Drain the bad nodes, requeue the job excluding them, and (optionally) wait until it runs again.

        Calling it again with the same request is safe: if the job was already requeued for this action it
        reports that instead of requeueing again; if an earlier call stopped before the requeue, it finishes.

        Raises:
            AdapterError: a strategy other than ``restart``; no single running job; suspects that are not
                the job's nodes or cannot be named; a job that cannot be requeued (checked before anything
                is drained); excluding the nodes would leave too few for the job; a Slurm command failed
                (``transient`` when the controller did not answer).
        """
        if request.strategy != "restart":
            raise AdapterError(f"slurm adapter cannot {request.strategy!r} (only 'restart')")
        if not request.id or any(c.isspace() for c in request.id):
            raise AdapterError(f"action id {request.id!r} cannot be written into Slurm (empty or has spaces)")
        prior = self.recover(request)
        if prior is not None and prior.ok:
            # a retry of an action whose requeue went through (its answer was lost): report, never requeue twice
            return ActionOutcome(ok=True, detail=f"already carried out; {prior.detail}", result=prior.result)
        labels = {**self.labels, **request.labels}
        job = self._find(labels, running_only=True)
        job_nodes = self._hostnames(job.node_list)
        bad = self._bad_nodes(request.params, job, job_nodes)
        if not (job.requeue and job.batch):
            raise AdapterError(f"Slurm job {job.job_id} cannot be requeued (Requeue={int(job.requeue)}, "
                               f"BatchFlag={int(job.batch)}): submit it with --requeue; nothing was drained")
        self._check_room(job, bad)
        try:
            text = render(self.drain_template, self.job, labels, action=request.id,
                          reason=request.reason or "fail-slow suspect", nodes=",".join(bad),
                          slurm_job_id=job.job_id)
        except ConfigError as exc:
            raise AdapterError(str(exc)) from None
        reason = clean_reason(text, request.id)

        self._scontrol("update", f"JobId={job.job_id}", f"AdminComment={marker(request.id, job.restarts)}")
        self._scontrol("update", f"NodeName={','.join(bad)}", "State=DRAIN", f"Reason={reason}")
        t_requeue = self._clock()
        try:
            self._scontrol("requeue", job.job_id)
        except AdapterError as exc:
            raise AdapterError(f"drained {','.join(bad)} but Slurm did not requeue job {job.job_id}: {exc}",
                               transient=exc.transient) from None
        excluded = self._exclude(job, bad)
        result: dict[str, Any] = {"slurm_job_id": job.job_id, "drained": bad, "reason": reason,
                                  "excluded": excluded, "old_nodes": job_nodes, "restarts_before": job.restarts,
                                  "new_nodes": None}
        done = f"drained {','.join(bad)}, requeued Slurm job {job.job_id}"
        if self.wait_running_s == 0:
            return ActionOutcome(ok=True, detail=done + " (not waiting for it to run)", result=result)
        return self._wait_running(job, t_requeue, result, done)

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """What became of a restart the remediator was interrupted in, from the job's mark and drain reasons.

        Never drains or requeues. Returns None when no job carries the action's mark and no node was drained
        for it (the action never started, or its traces were removed).

        Raises:
            AdapterError: Slurm does not answer (``transient``).
        """
        if request.strategy != "restart":
            return None
        labels = {**self.labels, **request.labels}
        drained = self._drained_for(request.id)
        job: SlurmJob | None = None
        before = None
        for candidate in self._candidates(labels):
            mark = parse_marker(candidate.admin_comment)
            if mark is not None and mark[0] == request.id:
                job, before = candidate, mark[1]
                break
        if job is None or before is None:
            if not drained:
                return None
            return ActionOutcome(ok=False, detail=f"recovered: {','.join(drained)} drained for this action, "
                                 "no job marked with it; not requeued again", result={"drained": drained})
        result: dict[str, Any] = {"slurm_job_id": job.job_id, "drained": drained, "restarts_before": before,
                                  "restarts": job.restarts, "state": job.state,
                                  "new_nodes": self._hostnames(job.node_list) if job.state == "RUNNING" else None}
        if job.restarts <= before:
            return ActionOutcome(ok=False, result=result,
                                 detail=f"recovered: Slurm job {job.job_id} was not requeued by this action "
                                 f"(drained: {','.join(drained) or 'none'}); not done again")
        return ActionOutcome(ok=True, result=result,
                             detail=f"recovered: drained {','.join(drained) or 'none'}, Slurm job {job.job_id} "
                             f"requeued (restart {job.restarts}), now {job.state}")

    # --- steps ---

    def _bad_nodes(self, params: Mapping[str, Any], job: SlurmJob, job_nodes: list[str]) -> list[str]:
        names = params.get("exclude_nodes") or []
        ranks = params.get("exclude_ranks") or []
        if not isinstance(names, Sequence) or isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise AdapterError(f"exclude_nodes must be a list of node names, got {names!r}")
        if not isinstance(ranks, Sequence) or not all(isinstance(r, int) for r in ranks):
            raise AdapterError(f"exclude_ranks must be a list of ranks, got {ranks!r}")
        bad = {self.node_map.get(str(n), str(n)) for n in names}
        if ranks and self.ranks_per_node is not None:
            for r in ranks:
                idx = r // self.ranks_per_node
                if r < 0 or idx >= len(job_nodes):
                    raise AdapterError(f"rank {r} is not on any of job {job.job_id}'s {len(job_nodes)} nodes")
                bad.add(job_nodes[idx])
        elif ranks and not names:
            raise AdapterError("the slurm adapter needs node names for exclude_ranks (set ranks_per_node)")
        if not bad:
            raise AdapterError("restart needs exclude_nodes (or exclude_ranks with ranks_per_node)")
        foreign = sorted(bad - set(job_nodes))
        if foreign:
            raise AdapterError(f"{','.join(foreign)} not among Slurm job {job.job_id}'s nodes ({job.node_list})")
        return sorted(bad)

    def _check_room(self, job: SlurmJob, bad: list[str]) -> None:
        """Refuse to strand the job: enough usable nodes must remain in its partition once `bad` is drained."""
        args = ["-h", "-N", "-o", "%N %T"] + (["-p", job.partition] if job.partition else [])
        states = dict(line.split(maxsplit=1) for line in self._run("sinfo", *args).splitlines() if line.strip())
        usable = [n for n, s in states.items() if n not in bad and s.rstrip("*~#!%$@^-+") in USABLE]
        if len(usable) < job.num_nodes:
            raise AdapterError(f"draining {','.join(bad)} would leave {len(usable)} usable nodes in partition "
                               f"{job.partition!r} for a {job.num_nodes}-node job; nothing was drained")

    def _exclude(self, job: SlurmJob, bad: list[str]) -> bool:
        """Add `bad` to the job's ExcNodeList (only possible while it is pending; false if Slurm refused)."""
        nodes = sorted(set(self._hostnames(job.exc_node_list)) | set(bad))
        try:
            self._scontrol("update", f"JobId={job.job_id}", f"ExcNodeList={','.join(nodes)}")
        except AdapterError:
            # The drain alone keeps the job off the nodes; the exclusion only outlives an early resume.
            return False
        return True

    def _wait_running(self, job: SlurmJob, t_requeue: float, result: dict[str, Any], done: str) -> ActionOutcome:
        deadline = t_requeue + self.wait_running_s
        while True:
            try:
                now = self._show_job(job.job_id)
            except AdapterError as exc:
                # the requeue is done: a controller hiccup while watching must not turn into a retry of it
                if not exc.transient or self._clock() >= deadline:
                    raise
                self._sleep(self.poll_interval_s)
                continue
            if now.state == "RUNNING" and now.restarts > job.restarts:
                seen = self._clock()
                start = now.start_time if now.start_time is not None else seen
                # StartTime has one-second resolution; never report more than was observed, nor less than 0
                pause = min(max(start - t_requeue, 0.0), seen - t_requeue)
                nodes = self._hostnames(now.node_list)
                result.update(new_nodes=nodes, restarts=now.restarts, running=True)
                on_bad = sorted(set(nodes) & set(result["drained"]))
                if on_bad:
                    return ActionOutcome(ok=False, result=result, pause_s=pause,
                                         detail=f"{done}, but it runs again on {','.join(on_bad)}")
                return ActionOutcome(ok=True, result=result, pause_s=pause,
                                     detail=f"{done}; running again on {now.node_list} after {pause:.0f} s")
            if now.restarts > job.restarts and now.state in FINISHED:
                result.update(restarts=now.restarts, running=False, state=now.state)
                return ActionOutcome(ok=False, result=result, detail=f"{done}, but it ended {now.state}")
            if self._clock() >= deadline:
                result.update(restarts=now.restarts, running=False, state=now.state)
                return ActionOutcome(ok=True, result=result,
                                     detail=f"{done}; not running again after {self.wait_running_s:.0f} s "
                                     f"({now.state}, {now.reason or 'no reason'})")
            self._sleep(self.poll_interval_s)

    # --- reading Slurm ---

    def _find(self, labels: Mapping[str, str], *, running_only: bool) -> SlurmJob:
        job_id = labels.get(self.job_id_label)
        if job_id:
            if not _JOB_ID.match(job_id):
                raise AdapterError(f"label {self.job_id_label}={job_id!r} is not a Slurm job id")
            job = self._show_job(job_id)
            if running_only and job.state != "RUNNING":
                raise AdapterError(f"Slurm job {job_id} is {job.state}, not RUNNING")
            return job
        states = "RUNNING" if running_only else "RUNNING,PENDING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED"
        ids = self._run("squeue", f"--name={self.job_name}", f"--states={states}", "-h", "-o", "%i").split()
        if len(ids) != 1:
            what = "running" if running_only else "active"
            found = f"{len(ids)} ({', '.join(ids)})" if ids else "none"
            raise AdapterError(f"expected one {what} Slurm job named {self.job_name!r}, found {found}")
        return self._show_job(ids[0])

    def _candidates(self, labels: Mapping[str, str]) -> list[SlurmJob]:
        """Jobs an earlier action may have marked: the labelled id, else every job of the name Slurm still knows."""
        job_id = labels.get(self.job_id_label)
        if job_id:
            if not _JOB_ID.match(job_id):
                return []
            try:
                return [self._show_job(job_id)]
            except AdapterError as exc:
                if exc.transient:
                    raise
                return []
        ids = self._run("squeue", f"--name={self.job_name}", "--states=all", "-h", "-o", "%i").split()
        return [self._show_job(i) for i in dict.fromkeys(ids)]

    def _show_job(self, job_id: str) -> SlurmJob:
        for line in self._run("scontrol", "show", "job", "-o", job_id).splitlines():
            fields = parse_fields(line)
            # an array task is shown under its own JobId, with the 123_4 form split over two fields
            if job_id in (fields.get("JobId"), f"{fields.get('ArrayJobId')}_{fields.get('ArrayTaskId')}"):
                return SlurmJob.from_fields(fields)
        raise AdapterError(f"Slurm job {job_id} not found")

    def _requeue_hold(self) -> float:
        if self._hold_s is None:
            self._hold_s = requeue_hold_s(self._scontrol("show", "config"))
        return self._hold_s

    def _hostnames(self, node_list: str) -> list[str]:
        if not node_list:
            return []
        return self._run("scontrol", "show", "hostnames", node_list).split()

    def _drained_for(self, action_id: str) -> list[str]:
        """Nodes drained (or draining) with a reason naming `action_id`."""
        out = self._run("sinfo", "-h", "-N", "-o", "%N\t%T\t%E")
        nodes = set()
        for line in out.splitlines():
            parts = line.split("\t", 2)
            if len(parts) == 3 and parts[1].startswith("drain") and reason_names(parts[2], action_id):
                nodes.add(parts[0])
        return sorted(nodes)

    # --- running commands ---

    def _scontrol(self, *args: str) -> str:
        return self._run("scontrol", *args)

    def _run(self, cmd: str, *args: str) -> str:
        argv = [self._bin[cmd], *args]
        try:
            res = subprocess.run(argv, env=self._env, capture_output=True, text=True,
                                 timeout=self.command_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise AdapterError(f"{cmd} {' '.join(args)}: no answer within {self.command_timeout_s:.0f} s",
                               transient=True) from None
        except OSError as exc:
            raise AdapterError(f"{cmd}: {exc} (is Slurm installed, or bin_dir right?)") from None
        if res.returncode != 0:
            err = (res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}").splitlines()
            msg = "; ".join(err[-3:])
            raise AdapterError(f"{cmd} {' '.join(args)}: {msg}", transient=bool(TRANSIENT.search(msg)))
        return res.stdout


def _str_dict(value: dict[Any, Any], key: str) -> dict[str, str]:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"option {key!r} must map strings to strings")
    return dict(value)


def _positive(options: Mapping[str, Any], key: str, default: float) -> float:
    value = float(option(options, key, (int, float), default))
    if value <= 0:
        raise ConfigError(f"option {key!r} must be > 0, got {value}")
    return value


def _non_negative(options: Mapping[str, Any], key: str, default: float) -> float:
    value = float(option(options, key, (int, float), default))
    if value < 0:
        raise ConfigError(f"option {key!r} must be >= 0, got {value}")
    return value

