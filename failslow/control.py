"""The client side of the testbed's run-directory control protocol (plain JSON files; docs/testbed.md).

A running ``failslow testbed run --run-dir DIR`` answers requests written as ``DIR/requests/<id>.json`` =
``{"id", "action", ...args}`` (written atomically: a temporary file, then a rename) with
``DIR/responses/<id>.json`` = ``{"id", "ok": bool, "result" | "error"}``. The id names both files, so a
caller that chose the id (the remediator uses its action id) can find out later, after a crash of its own,
whether the job took the request and what it answered — without sending it again.

Processes that must not import the testbed (the remediator service) and the testbed's own ``control``
command share this client.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from failslow.errors import InputError

_ID_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class ControlTimeout(TimeoutError):
    """The job did not answer in time (gone, or busy with a long request such as a restart)."""


class RunDirClient:
    """Requests to one running testbed job through its run directory."""

    def __init__(self, run_dir: str | Path, timeout_s: float = 180.0, poll_s: float = 0.05) -> None:
        self.run_dir, self.timeout_s, self.poll_s = Path(run_dir), timeout_s, poll_s
        if not (self.run_dir / "requests").is_dir():
            raise InputError(f"{run_dir} is not a running testbed's run directory (no requests/)")

    def _paths(self, rid: str) -> tuple[Path, Path]:
        if not rid or not set(rid) <= _ID_OK or rid.startswith("."):
            raise InputError(f"request id {rid!r}: letters, digits, '-', '_' and '.' only")
        return self.run_dir / "requests" / f"{rid}.json", self.run_dir / "responses" / f"{rid}.json"

    def send(self, action: str, rid: str | None = None, **args: Any) -> str:
        """Write one request (without waiting); returns its id. An id already answered is not sent again."""
        rid = rid or uuid.uuid4().hex[:12]
        req, resp = self._paths(rid)
        if resp.exists() or req.exists():
            return rid
        tmp = req.with_name(f".{rid}.tmp")
        tmp.write_text(json.dumps({"id": rid, "action": action, **args}))
        os.replace(tmp, req)
        return rid

    def answer(self, rid: str) -> dict[str, Any] | None:
        """The job's answer to request `rid`, or None while it has none."""
        _req, resp = self._paths(rid)
        try:
            doc: dict[str, Any] = json.loads(resp.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # being written (the testbed renames into place, so only a foreign writer)
        return doc

    def pending(self, rid: str) -> bool:
        """Whether request `rid` was written and the job has not picked it up yet."""
        return self._paths(rid)[0].exists()

    def wait(self, rid: str, timeout_s: float | None = None) -> Any:
        """Wait for the answer to `rid`; returns its result.

        Raises:
            InputError: the job refused the request (its message).
            ControlTimeout: no answer in time.
        """
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            doc = self.answer(rid)
            if doc is not None:
                if not doc.get("ok"):
                    raise InputError(str(doc.get("error")))
                return doc.get("result")
            if time.monotonic() >= deadline:
                raise ControlTimeout(f"testbed did not answer request {rid} within "
                                     f"{self.timeout_s if timeout_s is None else timeout_s:.0f} s")
            time.sleep(self.poll_s)

    def request(self, action: str, rid: str | None = None, timeout_s: float | None = None, **args: Any) -> Any:
        """Send one request and wait for its result (see :meth:`wait`)."""
        return self.wait(self.send(action, rid, **args), timeout_s)
