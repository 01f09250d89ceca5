"""A fork server for rank processes: import torch once, fork every rank from it.

Importing torch costs seconds of CPU per process; with every rank of a job importing it at once on a
2-core machine, start-up took longer than a short job's training. The launcher starts one zygote,
which imports torch and the worker, then for each spawn request forks a child that enters the
node's network namespace (``setns`` on ``/run/netns/<name>``), takes its environment, redirects its
output to its log and runs :func:`testbed.worker.main`. Nothing in torch has started threads before
the fork (no tensor op runs in the zygote), so the children are clean.

Protocol (stdin/stdout, one JSON object per line):

* request ``{"rank": R, "netns": NAME | null, "env": {...}, "log": PATH, "argv": [RUN_DIR, RANK]}``
* reply ``{"rank": R, "pid": PID}``

A child's exit status is written to ``<exit_dir>/<pid>`` when the zygote reaps it. The zygote dies
with the launcher (PR_SET_PDEATHSIG) and its children die with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into network namespace `name`."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(req: dict[str, object]) -> None:
    # runs in the forked child; never returns
    code = 1
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the request pipe stays the zygote's alone
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        if req.get("netns"):
            enter_netns(str(req["netns"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(req["env"]).items()})  # type: ignore[call-overload]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from testbed import worker

        code = worker.main([str(a) for a in req["argv"]])  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(exit_dir: Path) -> int:
    """Answer spawn requests until stdin closes; reap children and record their exit status."""
    # the point of the zygote: torch is imported once and shared by every rank it forks
    import torch
    import torch.distributed  # noqa: F401

    from testbed import worker  # noqa: F401

    exit_dir.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"ready": True}), flush=True)
    buf = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([0], [], [], 0.1)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children.add(pid)
                print(json.dumps({"rank": req["rank"], "pid": pid}), flush=True)
        _reap(children, exit_dir)
    for pid in list(children):  # launcher closed the pipe: end the job
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while children:
        _reap(children, exit_dir, block=True)
    return 0


def _reap(children: set[int], exit_dir: Path, block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        tmp = exit_dir / f"{pid}.tmp"
        tmp.write_text(str(code))
        os.replace(tmp, exit_dir / str(pid))
        if block:
            return


def main(argv: list[str]) -> int:
    """Entry point: ``python -m testbed.zygote EXIT_DIR``."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return serve(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
