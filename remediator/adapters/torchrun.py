"""Checkpoint-restart of a torchrun (TorchElastic) job without a bad node, onto a spare where one is free.

A torchrun job runs one elastic agent per node, all meeting at one c10d rendezvous
(``--nnodes=MIN:MAX --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB --max-restarts=K``). When
one agent goes away, the workers of the others fail at their next collective, their agents re-rendezvous
among the agents still alive (plus any agent that has joined meanwhile) and restart all workers, which
resume from the training script's last checkpoint. This adapter turns that into "restart excluding node X":

1. optionally ask the job to checkpoint now (it writes a request file the training script polls and waits
   for the script's acknowledgement file), so that little work is recomputed;
2. stop the agent of each excluded node: ``SIGTERM`` to the pid in its pid file (local agents), or a
   configured command per node (``ssh NODE pkill ...``); ``SIGKILL`` after ``stop_timeout_s``;
3. optionally start an agent on a free spare node (a configured command) right after telling the agents
   to stop, so that it is up in time for the survivors' next rendezvous round;
4. watch the job's progress file until it trains again, and measure the pause (stop to first new step,
   summed over every restart it took) and the iterations recomputed (last step before minus the step
   resumed from).

Behaviour observed with torch 2.13 (tests/integration/test_torchrun_adapter.py runs it for real):

* A ``SIGTERM``ed agent stops its workers and exits (2 s idle, 4-5 s on a loaded 2-core VM) without
  closing the rendezvous. The survivors' workers fail when the stopped worker's connections close (gloo:
  "Connection closed by peer"); their agents count a restart (``TORCHELASTIC_RESTART_COUNT`` + 1) and
  wait until the dead agent's heartbeat expires (``keep_alive_interval`` × ``keep_alive_max_attempt``,
  5 s × 3 by default) and then ``last_call_timeout`` (30 s by default) before the new round completes.
  Both are ``--rdzv-conf`` settings. The rest of the pause is the new workers' start (importing torch,
  loading the checkpoint), which dominates on a small machine.
* A spare that reaches the rendezvous before that round closes joins it; one that comes later makes the
  agents restart their workers once more (a membership change, which does not bump the restart count),
  and the pause doubles.
* A fresh agent joining an existing job hangs in the rendezvous and after 60 s takes the whole job down
  unless the agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with the default shared TCP store
  the surviving rank-0 agent does not publish the worker store address in the new round. Jobs that want
  spares must set it on every agent.
* The agent that hosts the c10d store (the one whose host is the rendezvous endpoint) takes the rendezvous
  with it; the ``rdzv_host_node`` option makes the adapter refuse to stop it.

The progress file is JSON lines, one per rank per step, with (key names configurable in
``progress_keys``): ``step`` (the step just completed), ``attempt`` (a value shared by all ranks of one
start of the worker group and new at every restart, e.g. rank 0's start time broadcast; without it the
adapter falls back to ``(restart, world)``, which cannot tell a membership-change restart apart),
``node``, ``rank``, ``world``, ``restart`` and ``time`` (Unix seconds; without it the time the adapter read
the line). The checkpoint request file holds the action id; the acknowledgement may be JSON with ``id``
and ``step``.

The same lines tell what a restart costs this job before the remediator has made one: every start of the
worker group after another in the progress files' last MiB (an elastic restart after a failure, a
membership change, an earlier action) is a pause, from the old group's last line to the new group's first,
plus the steps recomputed at the old group's pace. :meth:`Adapter.info` gives the planner the median of
the latest five as ``JobInfo.costs["restart"]``. With none seen, it gives the job's own start-up where the
agents are local (``pid_file``): from the start of the latest agent process that ran the first worker group
to that group's first progress line (the head of the progress files), as the testbed adapter does. That is
the part of a restart the job has already shown: the rendezvous and the workers' start (in the
integration test 10.6 s of start-up, and the restart after it paused 11.4 s), without the steps
recomputed since the last checkpoint. Without local agents, or when the first group's lines or agents are
gone, there is no estimate.

Options (templates take ``{job}``, the job's labels, and the fields named):

=====================  =====================================================================================
``pid_file``           template with ``{node}``: the agent's pid (local agents); lists the job's nodes
``stop_command``       argv template with ``{node}``: stops a node's agent (used instead of signalling)
``nodes``              the job's nodes, where no pid files tell them
``spare_nodes``        idle nodes a spare agent may be started on, in order of preference
``spare_command``      argv template with ``{spare}``: starts an agent there (may keep running)
``spare_log``          template with ``{spare}``: where the spare command's output goes (default: a temp file)
``progress_file``      template (a glob is allowed, e.g. one file per rank): the job's progress lines
``progress_keys``      ``{"step": ..., "attempt": ..., ...}``: key names in the progress lines
``checkpoint_request`` template: the file that asks the job to checkpoint now
``checkpoint_ack``     template: the job's acknowledgement (required with ``checkpoint_request``)
``journal``            template with ``{action}``: per-action record, what :meth:`Adapter.recover` reads
``rdzv_host_node``     the node whose agent hosts the c10d store: never stopped
``pid_match``          substrings (templates) one of which the agent's command line must contain
=====================  =====================================================================================

and the time limits ``checkpoint_timeout_s`` (300), ``stop_timeout_s`` (60), ``command_timeout_s`` (60),
``resume_timeout_s`` (900), ``spare_join_timeout_s`` (300), ``spare_grace_s`` (2) and ``poll_interval_s``
(0.5).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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

_PROGRESS_KEYS = ("step", "attempt", "node", "rank", "world", "restart", "time")
_KNOWN_OPTIONS = frozenset({
    "pid_file", "stop_command", "nodes", "spare_nodes", "spare_command", "spare_log", "progress_file",
    "progress_keys", "checkpoint_request", "checkpoint_ack", "journal", "rdzv_host_node", "pid_match",
    "checkpoint_timeout_s", "stop_timeout_s", "command_timeout_s", "resume_timeout_s", "spare_join_timeout_s",
    "spare_grace_s", "poll_interval_s",
})
_TAIL_BYTES = 1 << 20
_HEAD_BYTES = 64 << 10  # where the first worker group's first lines are looked for
RESTARTS_KEPT = 5  # the expected cost of a restart is the median of the job's latest restarts, this many
_RECOVER_BYTES = 64 << 20
_MARK = "\x00node\x00"
_SAFE_ID = re.compile(r"[^A-Za-z0-9._-]")


# --------------------------------------------------------------------------------------------------------------
# Progress lines: reading (I/O) apart from summarising (pure)


@dataclass(frozen=True)
class ProgressRecord:
    """One progress line, reduced to what the adapter uses.

    Attributes:
        step: The step the rank just completed (None: the line has none).
        attempt: Identity of the worker-group start that wrote it.
        node: The node the rank runs on.
        rank: The global rank.
        world: The world size of that start.
        restart: ``TORCHELASTIC_RESTART_COUNT`` of the rank's agent.
        time: When the step completed (the line's own time, else when the adapter read it).
    """

    step: int | None
    attempt: str | None
    node: str | None
    rank: int | None
    world: int | None
    restart: int | None
    time: float


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value)


def parse_progress(data: bytes, keys: Mapping[str, str], seen_at: float) -> tuple[list[ProgressRecord], int]:
    """Progress records in `data`, and how many bytes of it were complete lines.

    A trailing partial line (the writer is mid-write) is left for the next read; lines that are not JSON
    objects are skipped, since a training script may share the file with other output.
    """
    end = data.rfind(b"\n") + 1
    out: list[ProgressRecord] = []
    for raw in data[:end].splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        t = obj.get(keys["time"])
        attempt = obj.get(keys["attempt"])
        world, restart = _as_int(obj.get(keys["world"])), _as_int(obj.get(keys["restart"]))
        if attempt is None:
            attempt_id = None if world is None and restart is None else f"restart={restart},world={world}"
        else:
            attempt_id = json.dumps(attempt, sort_keys=True)
        node = obj.get(keys["node"])
        out.append(ProgressRecord(
            step=_as_int(obj.get(keys["step"])), attempt=attempt_id,
            node=None if node is None else str(node), rank=_as_int(obj.get(keys["rank"])), world=world,
            restart=restart,
            time=float(t) if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            else seen_at))
    return out, end


class _ProgressFiles:
    """Follows the progress file(s) from remembered offsets; a file that shrank is read again from 0."""

    def __init__(self, pattern: str, keys: Mapping[str, str], clock: Callable[[], float]) -> None:
        self._pattern, self._keys, self._clock = pattern, keys, clock
        self._offsets: dict[str, int] = {}

    def _paths(self) -> list[str]:
        return sorted(glob.glob(self._pattern)) if glob.has_magic(self._pattern) else [self._pattern]

    def tail(self) -> list[ProgressRecord]:
        """Records in the last MiB of each file; remembers the current ends as the offsets to follow from."""
        out: list[ProgressRecord] = []
        for path in self._paths():
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    start = max(0, size - _TAIL_BYTES)
                    f.seek(start)
                    data = f.read()
            except FileNotFoundError:
                self._offsets[path] = 0
                continue
            except OSError as exc:
                raise AdapterError(f"cannot read progress file {path}: {exc}", transient=True) from None
            if start > 0:  # the first line is probably cut
                data = data[data.find(b"\n") + 1:]
            recs, used = parse_progress(data, self._keys, self._clock())
            out.extend(recs)
            self._offsets[path] = size - (len(data) - used)
        return out

    def head(self) -> list[ProgressRecord]:
        """Records in the first ``_HEAD_BYTES`` of each file (complete lines only); offsets are left alone."""
        out: list[ProgressRecord] = []
        for path in self._paths():
            try:
                with open(path, "rb") as f:
                    data = f.read(_HEAD_BYTES)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise AdapterError(f"cannot read progress file {path}: {exc}", transient=True) from None
            out.extend(parse_progress(data, self._keys, self._clock())[0])
        return out

    def read_new(self, limit: int | None = None) -> list[ProgressRecord]:
        """Complete lines written since the last call (files that appeared since: from their start).

        Args:
            limit: Read at most this many bytes per file (the rest is left for the next call).
        """
        out: list[ProgressRecord] = []
        for path in self._paths():
            off = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    if size < off:
                        off = 0
                    f.seek(off)
                    data = f.read(-1 if limit is None else limit)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise AdapterError(f"cannot read progress file {path}: {exc}", transient=True) from None
            recs, used = parse_progress(data, self._keys, self._clock())
            out.extend(recs)
            self._offsets[path] = off + used
        return out

    def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    def set_offsets(self, offsets: Mapping[str, int]) -> None:
        self._offsets = dict(offsets)


@dataclass
class _Attempt:
    attempt: str | None
    first_step: int | None
    first_time: float
    max_step: int | None
    last_time: float
    ranks: dict[int, str] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    world: int | None = None


@dataclass
class ResumeSummary:
    """What the progress lines say about the job since the agents were stopped.

    Attributes:
        last_step_before: Highest step the pre-stop worker group completed (None: unknown).
        attempts: The new worker-group starts since the stop, in order (first step, nodes, ...).
        pause_s: Seconds without progress since the stop, summed over all restarts (None: not resumed).
        iterations_lost: Steps completed and then recomputed, summed over all restarts (None: unknown).
    """

    last_step_before: int | None
    attempts: list[_Attempt]
    pause_s: float | None
    iterations_lost: int | None

    @property
    def resumed(self) -> bool:
        return bool(self.attempts)

    @property
    def latest(self) -> _Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def settled(self) -> bool:
        """Whether the latest start has completed a second step, so all its ranks have reported the first.

        A rank writes step k's line before it enters step k + 1's collectives, which cannot finish until
        every rank has entered them too.
        """
        a = self.latest
        if a is None:
            return False
        if a.first_step is None or a.max_step is None:
            return True
        return a.max_step > a.first_step


def summarise(records: Iterable[ProgressRecord], old_attempts: Iterable[str | None], last_step_before: int | None,
              t_stop: float) -> ResumeSummary:
    """Pure: the restarts seen in `records` (file order, written since the stop at `t_stop`).

    Records of an attempt already running before the stop (`old_attempts`) are late lines of the stopped
    worker group; any other attempt is a new start of the worker group.
    """
    old = set(old_attempts)
    attempts: list[_Attempt] = []
    by_id: dict[str | None, _Attempt] = {}
    last_before = last_step_before
    # The highest step of the worker group running at each point, and when it last made progress (a stop
    # cuts that off: the pause starts at the stop even if a late line of the old group follows).
    cur_max, cur_last = last_step_before, t_stop
    pause, lost, lost_known = 0.0, 0, True
    for r in records:
        if r.attempt in old:
            if not attempts:  # a late line of the stopped group; after a new start it is stale noise
                if r.step is not None:
                    last_before = r.step if last_before is None else max(last_before, r.step)
                    cur_max = last_before
                cur_last = max(cur_last, r.time)
            continue
        a = by_id.get(r.attempt)
        if a is None:
            a = _Attempt(r.attempt, r.step, r.time, r.step, r.time, world=r.world)
            by_id[r.attempt] = a
            attempts.append(a)
            pause += max(0.0, r.time - cur_last)
            if r.step is None or cur_max is None:
                lost_known = False
            else:
                lost += max(0, cur_max - (r.step - 1))
        elif r.step is not None:
            a.max_step = r.step if a.max_step is None else max(a.max_step, r.step)
        a.last_time = max(a.last_time, r.time)
        if r.node is not None:
            if r.node not in a.nodes:
                a.nodes.append(r.node)
            if r.restart is not None:
                a.restarts[r.node] = max(a.restarts.get(r.node, 0), r.restart)
            if r.rank is not None:
                a.ranks[r.rank] = r.node
        if a is attempts[-1]:
            cur_max, cur_last = a.max_step, max(cur_last, a.last_time)
    return ResumeSummary(last_before, attempts, pause if attempts else None,
                         lost if attempts and lost_known else None)


@dataclass(frozen=True)
class PastRestart:
    """One start of the worker group after another, as the progress lines show it.

    Attributes:
        pause_s: From the previous group's last progress line to the new group's first.
        iterations_lost: Steps the previous group completed that the new one computed again (None: unknown).
        step_s: The previous group's seconds per step (None: it completed fewer than two).
    """

    pause_s: float
    iterations_lost: int | None
    step_s: float | None

    @property
    def cost_s(self) -> float:
        """Seconds of training the restart cost: the pause plus the recomputed steps at the old pace."""
        return self.pause_s + (self.iterations_lost or 0) * (self.step_s or 0.0)


def past_restarts(records: Iterable[ProgressRecord]) -> list[PastRestart]:
    """Pure: every restart of the worker group in `records` (any order, several files), oldest first.

    Groups are told apart by their attempt; lines without one are a single group (no restart to see).
    """
    groups: dict[str | None, list[ProgressRecord]] = {}
    for r in sorted(records, key=lambda r: r.time):
        groups.setdefault(r.attempt, []).append(r)
    if None in groups:
        return []
    out = []
    for prev, cur in itertools.pairwise(groups.values()):  # in the order of their first lines
        steps_prev = [r.step for r in prev if r.step is not None]
        first = next((r.step for r in cur if r.step is not None), None)
        lost = max(0, max(steps_prev) - (first - 1)) if steps_prev and first is not None else None
        out.append(PastRestart(max(0.0, cur[0].time - max(r.time for r in prev)), lost, _step_s(prev)))
    return out


def first_start_s(records: Iterable[ProgressRecord], agent_started: Mapping[str, float]) -> float | None:
    """Pure: the job's start-up, from the latest start of the agents that ran its first worker group to that
    group's first progress line (None when the lines or agents cannot tell it).

    Args:
        records: Progress lines from the head of the progress files (the first worker group's first lines).
        agent_started: Unix start time of each node's live agent.

    The first group is the attempt of the earliest line. It is the agents' first start only when its lines
    say restart 0 (where they carry a restart count) and every node of it still runs the agent that started
    before its first line: an agent that was replaced since, or lines from after a restart or a truncated
    file, give no estimate rather than one from the wrong start.
    """
    recs = sorted(records, key=lambda r: r.time)
    if not recs:
        return None
    group = [r for r in recs if r.attempt == recs[0].attempt]
    if any(r.restart not in (None, 0) for r in group):
        return None
    nodes = {r.node for r in group if r.node is not None}
    if len(nodes) < len({r.node for r in group}) or not nodes <= set(agent_started):
        return None  # a line without its node, or a node whose agent is gone
    first = group[0].time
    started = max(agent_started[n] for n in nodes)
    return first - started if first > started else None


def _step_s(records: list[ProgressRecord]) -> float | None:
    """Median over ranks of one group's seconds per step (a rank's first to last line)."""
    per_rank: dict[int | None, list[ProgressRecord]] = {}
    for r in records:
        if r.step is not None:
            per_rank.setdefault(r.rank, []).append(r)
    rates = []
    for rs in per_rank.values():
        done = (rs[-1].step or 0) - (rs[0].step or 0)
        if done > 0:
            rates.append((rs[-1].time - rs[0].time) / done)
    return statistics.median(rates) if rates else None


# --------------------------------------------------------------------------------------------------------------
# Agents: pid files and processes


def _proc_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, which is what an agent we are the parent of becomes, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # "pid (comm) S ...": comm may itself hold spaces and parentheses.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _started_at(pid: int) -> float | None:
    """Unix time the process `pid` started (from /proc, to the clock tick); None when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        now = time.time()
        ticks = int(fields[19])  # field 22 of stat, counted from the state (field 3)
    except (OSError, ValueError, IndexError):
        return None
    return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AdapterError(f"cannot read pid file {path}: {exc}", transient=True) from None
    return int(text) if text.isdigit() and int(text) > 0 else None


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _positive(options: Mapping[str, Any], key: str, default: float) -> float:
    value = float(option(options, key, (int, float), default))
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"option {key!r} must be a positive number of seconds, got {value}")
    return value


def _str_list(options: Mapping[str, Any], key: str, *, argv: bool = False) -> list[str] | None:
    value = option(options, key, list, None)
    if value is None:
        return None
    if not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"option {key!r} must be a list of non-empty strings")
    if argv and not value:
        raise ConfigError(f"option {key!r} must name a program")
    if not argv and len(set(value)) != len(value):
        raise ConfigError(f"option {key!r} lists a name twice")
    return list(value)


class Adapter:
    """Restarts one torchrun job's workers from its last checkpoint without the excluded nodes."""

    kind: ClassVar[str] = "torchrun"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any], *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        """Check the options (see the module docstring) against the job's labels.

        Raises:
            ConfigError: unknown or mistyped option, a template with an unknown field, or a missing partner
                option (a spare command without spares, a checkpoint request without its acknowledgement).
        """
        unknown = sorted(set(options) - _KNOWN_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown torchrun adapter option(s): {', '.join(unknown)}")
        self.job, self.labels = job, dict(labels)
        self._clock, self._sleep = clock, sleep

        self._pid_file: str | None = option(options, "pid_file", str, None)
        self._stop_command = _str_list(options, "stop_command", argv=True)
        if self._pid_file is None and self._stop_command is None:
            raise ConfigError("the torchrun adapter needs 'pid_file' or 'stop_command' to stop a node's agent")
        self._nodes = _str_list(options, "nodes") or []
        self._spares = _str_list(options, "spare_nodes") or []
        self._spare_command = _str_list(options, "spare_command", argv=True)
        if bool(self._spares) != (self._spare_command is not None):
            raise ConfigError("'spare_nodes' and 'spare_command' go together")
        self._spare_log: str | None = option(options, "spare_log", str, None)
        self._progress: str | None = option(options, "progress_file", str, None)
        keys = option(options, "progress_keys", Mapping, {})
        bad = sorted(set(keys) - set(_PROGRESS_KEYS))
        if bad or not all(isinstance(v, str) and v for v in keys.values()):
            raise ConfigError(f"'progress_keys' maps {', '.join(_PROGRESS_KEYS)} to key names; got {dict(keys)}")
        self._keys = {k: keys.get(k, k) for k in _PROGRESS_KEYS}
        self._ckpt_request: str | None = option(options, "checkpoint_request", str, None)
        self._ckpt_ack: str | None = option(options, "checkpoint_ack", str, None)
        if (self._ckpt_request is None) != (self._ckpt_ack is None):
            raise ConfigError("'checkpoint_request' and 'checkpoint_ack' go together")
        self._journal: str | None = option(options, "journal", str, None)
        self._rdzv_host: str | None = option(options, "rdzv_host_node", str, None)
        self._pid_match = _str_list(options, "pid_match") or ["torchrun", "torch.distributed.run"]
        self._t_ckpt = _positive(options, "checkpoint_timeout_s", 300)
        self._t_stop = _positive(options, "stop_timeout_s", 60)
        self._t_cmd = _positive(options, "command_timeout_s", 60)
        self._t_resume = _positive(options, "resume_timeout_s", 900)
        self._t_spare = _positive(options, "spare_join_timeout_s", 300)
        self._t_grace = _positive(options, "spare_grace_s", 2)
        self._poll = _positive(options, "poll_interval_s", 0.5)

        # Render every template once now, so that a typo fails when the config loads, not mid-action.
        for tpl, extra in [(self._pid_file, {"node": "n"}), (self._spare_log, {"spare": "n"}),
                           (self._progress, {}), (self._ckpt_request, {}), (self._ckpt_ack, {}),
                           (self._journal, {"action": "a"}),
                           *[(t, {"node": "n"}) for t in self._stop_command or []],
                           *[(t, {"spare": "n"}) for t in self._spare_command or []],
                           *[(t, {}) for t in self._pid_match]]:
            if tpl is not None:
                self._render(tpl, **extra)
        if self._pid_file is not None and "{node}" not in self._pid_file:
            raise ConfigError("'pid_file' must contain {node}")
        if self._journal is not None and "{action}" not in self._journal:
            raise ConfigError("'journal' must contain {action}")
        self._busy = threading.Lock()
        # Spare agents we started; kept so that the ones that exit are reaped rather than left as zombies.
        self._children: list[subprocess.Popen[bytes]] = []

    # ----------------------------------------------------------------------------------------------------------
    # Small helpers

    def _render(self, template: str, **extra: Any) -> str:
        return render(template, self.job, self.labels, **extra)

    def _pid_path(self, node: str) -> Path | None:
        return None if self._pid_file is None else Path(self._render(self._pid_file, node=node))

    def _progress_files(self) -> _ProgressFiles | None:
        return None if self._progress is None else _ProgressFiles(self._render(self._progress), self._keys,
                                                                 self._clock)

    def _journal_path(self, action_id: str) -> Path | None:
        if self._journal is None:
            return None
        return Path(self._render(self._journal, action=_SAFE_ID.sub("_", action_id)))

    def _write_journal(self, action_id: str, record: dict[str, Any]) -> None:
        path = self._journal_path(action_id)
        if path is not None:
            try:
                _write_atomic(path, json.dumps(record, sort_keys=True))
            except OSError as exc:
                raise AdapterError(f"cannot write journal {path}: {exc}", transient=True) from None

    def _read_journal(self, action_id: str) -> dict[str, Any] | None:
        path = self._journal_path(action_id)
        if path is None:
            return None
        try:
            rec = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise AdapterError(f"cannot read journal {path}: {exc}", transient=True) from None
        return rec if isinstance(rec, dict) and rec.get("id") == action_id else None

    def _agent_pid(self, node: str) -> int | None:
        """The live agent pid of `node` from its pid file; None when there is none or it is not an agent."""
        path = self._pid_path(node)
        pid = None if path is None else _read_pid(path)
        if pid is None or not _proc_alive(pid):
            return None
        # A pid file outlives its process; after a reboot or wrap-around the pid may name something else.
        cmd = _cmdline(pid)
        if cmd and not any(self._render(m) in cmd for m in self._pid_match):
            return None
        return pid

    def _pid_file_nodes(self) -> list[str]:
        if self._pid_file is None:
            return []
        parts = self._render(self._pid_file, node=_MARK).split(_MARK)
        # The node name is the part of a matching path where {node} stood (the same text at each place).
        rx = re.compile(re.escape(parts[0]) + r"(?P<node>[^/]+)" + r"(?P=node)".join(map(re.escape, parts[1:]))
                        + r"\Z")
        names = set()
        for path in glob.glob("*".join(glob.escape(p) for p in parts)):
            m = rx.match(path)
            if m:
                names.add(m.group("node"))
        return sorted(names)

    def _live_agents(self) -> dict[str, int]:
        return {n: pid for n in self._pid_file_nodes() if (pid := self._agent_pid(n)) is not None}

    @staticmethod
    def _latest(records: list[ProgressRecord]) -> _Attempt | None:
        """The newest worker-group start in `records` (by the time its lines were written)."""
        if not records:
            return None
        last = max(records, key=lambda r: r.time).attempt
        mine = [r for r in records if r.attempt == last]
        return summarise(mine, [], None, mine[0].time).latest

    # ----------------------------------------------------------------------------------------------------------
    # The contract

    def capabilities(self) -> frozenset[str]:
        """Only ``restart``: moving micro-batches between ranks is up to each torchrun script."""
        return frozenset({"restart"})

    def info(self) -> JobInfo:
        """Nodes with live agents (or as configured), free spares, the latest start's placement and step, and
        the expected cost of a restart from the ones the progress lines show, else from the job's start-up
        (``extra["startup_s"]``; module docstring).

        Raises:
            AdapterError: the progress or pid files cannot be read.
        """
        agents = self._live_agents()
        prog = self._progress_files()
        records = prog.tail() if prog is not None else []
        latest = self._latest(records)
        if self._pid_file is not None:
            nodes = sorted(agents)
        else:
            nodes = list(self._nodes) if latest is None or not latest.nodes else []
        for n in latest.nodes if latest is not None else []:
            if n not in nodes:
                nodes.append(n)
        placement = None
        if latest is not None and latest.ranks and sorted(latest.ranks) == list(range(len(latest.ranks))):
            placement = [nodes.index(latest.ranks[r]) for r in range(len(latest.ranks))]
        per_node = {sum(1 for v in latest.ranks.values() if v == n) for n in latest.nodes} if latest else set()
        layout = ({"dp": None, "pp": None, "tp": None, "ranks_per_node": per_node.pop()}
                  if len(per_node) == 1 else None)
        extra: dict[str, Any] = {"agents": agents}
        if latest is not None:
            extra.update(last_step=latest.max_step, world=latest.world, restarts=latest.restarts)
        history = past_restarts(records)[-RESTARTS_KEPT:]
        costs = {"restart": statistics.median(h.cost_s for h in history)} if history else {}
        if not history and prog is not None and agents:
            started = {n: t for n, pid in agents.items() if (t := _started_at(pid)) is not None}
            startup = first_start_s(prog.head(), started)
            if startup is not None:
                costs["restart"] = extra["startup_s"] = startup
        return JobInfo(layout=layout, placement=placement, nodes=nodes,
                       spare_nodes=[s for s in self._spares if s not in nodes and s not in agents],
                       costs=costs, extra=extra)

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Restart the job without ``params["exclude_nodes"]`` (and the nodes of ``exclude_ranks``).

        Blocks until the job trains again (or ``resume_timeout_s``); see the module docstring for the steps.

        Raises:
            AdapterError: not a restart, nodes the job does not have, nothing left to train on, the store
                host, another action in progress (transient), no checkpoint acknowledgement (transient,
                nothing stopped), or an agent that would not stop.
        """
        if request.strategy != "restart":
            raise AdapterError(f"torchrun adapter cannot {request.strategy!r}; it only restarts")
        if not self._busy.acquire(blocking=False):
            raise AdapterError(f"job {self.job}: another action is in progress", transient=True)
        try:
            done = self._read_journal(request.id)
            if done is not None and done.get("phase") == "done":
                return ActionOutcome(**done["outcome"])
            if done is not None and done.get("phase") != "checkpoint":
                raise AdapterError(f"action {request.id} was started before (phase {done.get('phase')}); "
                                   "recover() tells what became of it")
            return self._restart(request)
        finally:
            self._busy.release()

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """What became of `request` after a remediator restart, from its journal, pid files and progress.

        Reads only: never stops, starts or asks anything of the job.
        """
        if request.strategy != "restart":
            return None
        rec = self._read_journal(request.id)
        if rec is not None and rec.get("phase") == "done":
            return ActionOutcome(**rec["outcome"])
        if rec is not None and rec.get("phase") != "checkpoint":
            # Interrupted after the stop began: judge it from what the job did since, as execute() would.
            summary = None
            prog = self._progress_files()
            if prog is not None:
                prog.set_offsets(rec["offsets"])
                summary = summarise(prog.read_new(limit=_RECOVER_BYTES), rec["old_attempts"],
                                    rec["last_step_before"], rec["t_stop"])
            return self._outcome(list(rec["exclude"]), rec, summary, recovered=True)
        # Nothing was stopped by this action as far as any record tells (no journal, or it never got past
        # asking for a checkpoint): what the agents and the progress lines show is all there is.
        excluded = list(rec["exclude"]) if rec is not None else self._requested_nodes(request, strict=False)
        if not excluded or self._pid_file is None:
            return None
        running = [n for n in excluded if self._still_running(n)]
        if running:
            return ActionOutcome(False, f"not carried out: the agent(s) of {', '.join(running)} still run",
                                 {"exclude_nodes": excluded, "carried_out": False, "recovered": True})
        prog = self._progress_files()
        latest = self._latest(prog.tail()) if prog is not None else None
        if latest is None or not latest.nodes or any(n in latest.nodes for n in excluded):
            return None
        return ActionOutcome(True, f"the agent(s) of {', '.join(excluded)} are gone and the job trains on "
                             f"{', '.join(latest.nodes)} (pause unknown: no journal of the action)",
                             {"exclude_nodes": excluded, "nodes_after": list(latest.nodes), "world_after": latest.world,
                              "restart_counts": dict(latest.restarts), "recovered": True})

    # ----------------------------------------------------------------------------------------------------------
    # The restart itself

    def _requested_nodes(self, request: ActionRequest, *, strict: bool = True) -> list[str]:
        params = request.params
        nodes = params.get("exclude_nodes", []) or []
        ranks = params.get("exclude_ranks", []) or []
        if not isinstance(nodes, list | tuple) or not all(isinstance(n, str) for n in nodes):
            raise AdapterError("'exclude_nodes' must be a list of node names")
        if not isinstance(ranks, list | tuple) or not all(_as_int(r) is not None for r in ranks):
            raise AdapterError("'exclude_ranks' must be a list of ranks")
        out = list(dict.fromkeys(nodes))
        if ranks:
            prog = self._progress_files()
            latest = self._latest(prog.tail()) if prog is not None else None
            if latest is None or not latest.ranks:
                if strict:
                    raise AdapterError("cannot map 'exclude_ranks' to nodes: no progress lines with rank and node")
                return out
            missing = [r for r in ranks if int(r) not in latest.ranks]
            if missing and strict:
                raise AdapterError(f"job {self.job} has no rank(s) {missing} (world {latest.world})")
            out += [latest.ranks[int(r)] for r in ranks if int(r) in latest.ranks]
        return list(dict.fromkeys(out))

    def _still_running(self, node: str) -> bool:
        if self._pid_file is None:
            return False
        return self._agent_pid(node) is not None

    def _known_nodes(self, latest: _Attempt | None) -> list[str]:
        known = list(self._live_agents()) if self._pid_file is not None else list(self._nodes)
        if self._pid_file is None and latest is not None:
            known += [n for n in latest.nodes if n not in known]
        return known

    def _restart(self, request: ActionRequest) -> ActionOutcome:
        excluded = self._requested_nodes(request)
        if not excluded:
            raise AdapterError("a restart needs 'exclude_nodes' or 'exclude_ranks'")
        prog = self._progress_files()
        latest = self._latest(prog.tail()) if prog is not None else None
        known = self._known_nodes(latest)
        if not known:
            raise AdapterError(f"cannot tell which nodes job {self.job} has: configure 'pid_file' or 'nodes'")
        missing = [n for n in excluded if n not in known]
        if missing:
            raise AdapterError(f"job {self.job} has no running agent on {', '.join(missing)} "
                               f"(nodes: {', '.join(known)})")
        if self._rdzv_host is not None and self._rdzv_host in excluded:
            raise AdapterError(f"{self._rdzv_host} hosts the job's c10d rendezvous store: stopping it ends the job")
        free = [s for s in self._spares if s not in known and not self._still_running(s)]
        spares = free[:len(excluded)]
        if set(known) <= set(excluded) and not spares:
            raise AdapterError(f"excluding {', '.join(excluded)} leaves job {self.job} no node to train on")

        rec: dict[str, Any] = {"id": request.id, "job": self.job, "exclude": excluded, "phase": "checkpoint"}
        self._write_journal(request.id, rec)
        ckpt_step = self._checkpoint_now(request.id)

        # What the job looked like just before the stop: its attempts, last step and where to read on.
        before = prog.tail() if prog is not None else []
        current = self._latest(before)
        old_attempts = sorted({r.attempt for r in before}, key=str)
        last_step = current.max_step if current is not None else None
        t_stop = self._clock()
        rec.update(phase="stopping", t_stop=t_stop, checkpoint_step=ckpt_step, old_attempts=old_attempts,
                   last_step_before=last_step, offsets=prog.offsets() if prog is not None else {},
                   spares_planned=spares)
        self._write_journal(request.id, rec)

        # Spares start as soon as the agents are told to stop, not once they are gone: a new agent needs
        # seconds to import torch, and the survivors' next rendezvous round closes `last_call_timeout` after
        # the stopped agent's heartbeat expires; a spare that misses it costs the job one more restart.
        watch = {n: self._begin_stop(n) for n in excluded}
        spawned = {sp: self._spawn_spare(sp) for sp in spares}
        t_spawned = self._clock()
        killed = [n for n, pid in watch.items() if self._finish_stop(n, pid)]
        started, spare_errors = [], {}
        for spare, handle in spawned.items():
            err = handle if isinstance(handle, str) else self._check_spare(spare, *handle, t_spawned)
            if err is None:
                started.append(spare)
            else:
                spare_errors[spare] = err
        rec.update(phase="stopped", killed=killed, spares=started, spare_errors=spare_errors,
                   t_stopped=self._clock())
        self._write_journal(request.id, rec)

        summary = self._wait_resumed(prog, old_attempts, last_step, t_stop, excluded, started) \
            if prog is not None else None
        outcome = self._outcome(excluded, rec, summary, recovered=False)
        rec.update(phase="done", outcome=outcome.to_json())
        self._write_journal(request.id, rec)
        return outcome

    def _checkpoint_now(self, action_id: str) -> int | None:
        """Ask the job to checkpoint and wait for its acknowledgement; the step it saved, if it says."""
        if self._ckpt_request is None or self._ckpt_ack is None:
            return None
        req, ack = Path(self._render(self._ckpt_request)), Path(self._render(self._ckpt_ack))
        try:
            ack.unlink(missing_ok=True)  # an old acknowledgement must not pass for this request's
            _write_atomic(req, action_id + "\n")
        except OSError as exc:
            raise AdapterError(f"cannot ask job {self.job} to checkpoint ({req}): {exc}", transient=True) from None
        deadline = self._clock() + self._t_ckpt
        while self._clock() < deadline:
            try:
                text = ack.read_text()
            except FileNotFoundError:
                self._sleep(min(self._poll, 0.2))
                continue
            except OSError as exc:
                raise AdapterError(f"cannot read checkpoint acknowledgement {ack}: {exc}", transient=True) from None
            try:
                body = json.loads(text)
            except ValueError:
                return None
            if isinstance(body, dict) and body.get("id") not in (None, action_id):
                self._sleep(min(self._poll, 0.2))
                continue
            return _as_int(body.get("step")) if isinstance(body, dict) else None
        with contextlib.suppress(OSError):
            req.unlink(missing_ok=True)
        raise AdapterError(f"job {self.job} did not acknowledge the checkpoint request {req} within "
                           f"{self._t_ckpt:g} s; nothing was stopped", transient=True)

    def _begin_stop(self, node: str) -> int | None:
        """Tell `node`'s agent to stop; the pid to watch until it is gone (None: nothing local to watch).

        Raises:
            AdapterError: the stop command failed or the agent may not be signalled.
        """
        pid = self._agent_pid(node)
        if self._stop_command is not None:
            argv = [self._render(a, node=node) for a in self._stop_command]
            try:
                p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=self._t_cmd,
                                   check=False)
            except subprocess.TimeoutExpired:
                raise AdapterError(f"stop command for {node} ran over {self._t_cmd:g} s: {argv}") from None
            except OSError as exc:
                raise AdapterError(f"stop command for {node} did not start: {argv}: {exc}") from None
            if p.returncode != 0:
                raise AdapterError(f"stop command for {node} failed (exit {p.returncode}): {argv}: "
                                   f"{p.stderr.decode(errors='replace').strip()[-2000:]}")
        elif pid is not None:
            # SIGTERM lets the agent stop its workers; it then exits without closing the rendezvous.
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                return None
            except PermissionError as exc:
                raise AdapterError(f"may not signal the agent of {node} (pid {pid}): {exc}") from None
        return pid

    def _finish_stop(self, node: str, pid: int | None) -> bool:
        """Wait until `node`'s agent is gone, killing it after ``stop_timeout_s``; True if it was killed.

        Raises:
            AdapterError: the agent outlived ``SIGKILL``.
        """
        if pid is None or self._wait_gone(pid, self._t_stop):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pid, 10.0):
            raise AdapterError(f"the agent of {node} (pid {pid}) survived SIGTERM and SIGKILL")
        return True

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = self._clock() + timeout
        while _proc_alive(pid):
            if self._clock() >= deadline:
                return False
            self._sleep(0.1)
        return True

    def _spawn_spare(self, spare: str) -> tuple[subprocess.Popen[bytes], Path, bool] | str:
        """Start the spare command for `spare`: (process, its log, whether we wrote its pid file), or why not."""
        argv = [self._render(a, spare=spare) for a in self._spare_command or []]
        try:
            if self._spare_log is not None:
                log_path = Path(self._render(self._spare_log, spare=spare))
                log_path.parent.mkdir(parents=True, exist_ok=True)
            else:
                fd, name = tempfile.mkstemp(prefix=f"failslow-torchrun-{self.job}-{spare}-", suffix=".log")
                os.close(fd)
                log_path = Path(name)
            # Its own session: the agent must outlive this call and not share our signals. The child keeps
            # its own copy of the log descriptor.
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        except OSError as exc:
            return f"{argv}: {exc}"
        self._children = [c for c in self._children if c.poll() is None] + [proc]
        path = self._pid_path(spare)
        wrote = path is not None and self._agent_pid(spare) is None
        if wrote and path is not None:
            # If the command is the agent itself (a local torchrun), this is its pid file like the others',
            # so that info() lists it and a later restart can exclude it. Written now, so that nothing that
            # looks at the pid files meanwhile misses it.
            _write_atomic(path, f"{proc.pid}\n")
        return proc, log_path, wrote

    def _check_spare(self, spare: str, proc: subprocess.Popen[bytes], log_path: Path, wrote: bool,
                     t_spawned: float) -> str | None:
        """None if the spare command runs on after ``spare_grace_s`` or exited 0, else why it failed."""
        try:
            rc = proc.wait(max(0.0, t_spawned + self._t_grace - self._clock()))
        except subprocess.TimeoutExpired:
            return None
        path = self._pid_path(spare)
        if wrote and path is not None and _read_pid(path) == proc.pid:
            path.unlink(missing_ok=True)  # a launcher that returned: its pid is no agent's
        if rc == 0:
            return None
        return f"{proc.args!r} exited {rc}: {log_path.read_text(errors='replace').strip()[-2000:]}"

    def _wait_resumed(self, prog: _ProgressFiles, old_attempts: list[str | None], last_step: int | None,
                      t_stop: float, excluded: list[str], spares: list[str]) -> ResumeSummary:
        """Follow the progress lines until the job trains again, settled and (if started) with its spares."""
        records: list[ProgressRecord] = []
        deadline = self._clock() + self._t_resume
        spare_deadline = self._clock() + self._t_spare
        while True:
            records += prog.read_new()
            s = summarise(records, old_attempts, last_step, t_stop)
            now = self._clock()
            latest = s.latest
            if latest is not None and s.settled():
                if any(n in latest.nodes for n in excluded) or not latest.nodes:
                    return s
                if all(sp in latest.nodes for sp in spares) or now >= spare_deadline:
                    return s
            if now >= deadline:
                return s
            self._sleep(self._poll)

    def _outcome(self, excluded: list[str], rec: Mapping[str, Any], s: ResumeSummary | None, *,
                 recovered: bool) -> ActionOutcome:
        """The outcome of a restart whose agents were stopped, from the journal record and the progress."""
        spares = list(rec.get("spares", []))
        still = [n for n in excluded if self._still_running(n)]
        result: dict[str, Any] = {
            "exclude_nodes": excluded, "stopped": [n for n in excluded if n not in still],
            "killed": list(rec.get("killed", [])), "spares_started": spares,
            "spares_planned": list(rec.get("spares_planned", [])),
            "spare_errors": dict(rec.get("spare_errors", {})), "checkpoint_step": rec.get("checkpoint_step"),
            "last_step_before": rec.get("last_step_before"), "recovered": recovered,
        }
        if still:
            return ActionOutcome(False, f"the agent(s) of {', '.join(still)} still run", result)
        if s is None:
            return ActionOutcome(True, f"stopped the agent(s) of {', '.join(excluded)}; job progress not watched",
                                 result)
        result["last_step_before"] = s.last_step_before
        latest = s.latest
        if latest is None:
            what = "not yet" if recovered else f"not within {self._t_resume:g} s"
            return ActionOutcome(False, f"stopped {', '.join(excluded)}; the job has {what} trained again", result)
        first = s.attempts[0]
        result.update(resumed_step=first.first_step,
                      resumed_from=None if first.first_step is None else first.first_step - 1,
                      restarts_seen=len(s.attempts), nodes_after=list(latest.nodes), world_after=latest.world,
                      restart_counts=dict(latest.restarts),
                      spare_joined=all(sp in latest.nodes for sp in spares) if spares and latest.nodes else None)
        back = [n for n in excluded if n in latest.nodes]
        if back:
            return ActionOutcome(False, f"the job trains again but still on {', '.join(back)}", result,
                                 s.pause_s, s.iterations_lost)
        detail = (f"restarted without {', '.join(excluded)} from step {result['resumed_from']}"
                  f" on {', '.join(latest.nodes) or 'unknown nodes'} after {s.pause_s:.1f} s")
        if spares and result["spare_joined"] is False:
            detail += (f"; spare(s) {', '.join(spares)} not in the job (with torch's shared rendezvous store a "
                       "new agent cannot join: run the agents with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)")
        if rec.get("spare_errors"):
            detail += f"; spare(s) failed to start: {', '.join(rec['spare_errors'])}"
        return ActionOutcome(True, detail, result, s.pause_s, s.iterations_lost)
