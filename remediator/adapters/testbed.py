"""The testbed adapter: acts on a running ``failslow testbed run --run-dir DIR`` through its request files.

Options:

* ``run_dir`` (required, a template: ``{job}`` and alert labels may be used) — the job's run directory;
* ``timeout_s`` (default 240) — how long one request may take (a restart checkpoints, stops and respawns);
* ``progress_timeout_s`` (default 120) — after a restart, how long to wait for the first new iteration,
  which is when the pause is measured.

Capabilities: ``rebalance`` (the split applies at a near-future iteration boundary, the global batch and so
the gradient unchanged: no pause), ``topology`` (checkpoint, stop, restart with the given rank-to-node
placement) and ``restart`` (the same, moving the excluded nodes' ranks to the healthy nodes that hold the
fewest ranks). Nodes are named ``node0``, ``node1``, … as in the testbed. Every request file is named by
the action id, so :meth:`Adapter.recover` reads the job's answer to an action the remediator was killed
in the middle of instead of sending it again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from failslow.control import ControlTimeout, RunDirClient
from failslow.errors import InputError
from remediator.adapters.base import (
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    option,
    render,
)


def node_name(i: int) -> str:
    """The testbed's name of node `i`."""
    return f"node{i}"


def move_off(placement: list[int], num_nodes: int, bad: set[int]) -> list[int]:
    """The placement with every rank on a `bad` node moved to the healthy node holding the fewest ranks.

    Raises:
        AdapterError: every node is bad.
    """
    good = [n for n in range(num_nodes) if n not in bad]
    if not good:
        raise AdapterError(f"no healthy node left to move ranks to (bad: {sorted(bad)})")
    load = {n: sum(1 for p in placement if p == n) for n in good}
    out = list(placement)
    for r, n in enumerate(placement):
        if n in bad:
            dest = min(good, key=lambda g: (load[g], g))
            out[r] = dest
            load[dest] += 1
    return out


class Adapter:
    """:class:`remediator.adapters.base.TrainingAdapter` for a testbed job."""

    kind: ClassVar[str] = "testbed"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any]) -> None:
        self.job = job
        self.run_dir = Path(render(option(options, "run_dir", str), job, labels))
        self.timeout_s = float(option(options, "timeout_s", (int, float), 240.0))
        self.progress_timeout_s = float(option(options, "progress_timeout_s", (int, float), 120.0))
        unknown = set(options) - {"run_dir", "timeout_s", "progress_timeout_s"}
        if unknown:
            raise ConfigError(f"testbed adapter: unknown options {sorted(unknown)}")

    def _client(self) -> RunDirClient:
        try:
            return RunDirClient(self.run_dir, self.timeout_s)
        except InputError as exc:
            raise AdapterError(str(exc)) from None

    def _request(self, action: str, rid: str | None = None, timeout_s: float | None = None, **args: Any) -> Any:
        try:
            return self._client().request(action, rid, timeout_s, **args)
        except ControlTimeout as exc:
            raise AdapterError(str(exc), transient=True) from None
        except InputError as exc:
            raise AdapterError(f"testbed refused {action}: {exc}") from None

    def capabilities(self) -> frozenset[str]:
        """Micro-batch splits, placements and restarts."""
        return frozenset({"rebalance", "topology", "restart"})

    def status(self) -> dict[str, Any]:
        """The testbed's status answer."""
        st: dict[str, Any] = self._request("status", timeout_s=min(self.timeout_s, 30.0))
        return st

    def info(self) -> JobInfo:
        """Layout, placement, node names and the current micro-batch split."""
        st = self.status()
        return JobInfo(layout=st["layout"], placement=list(st["placement"]),
                       nodes=[node_name(i) for i in range(int(st["num_nodes"]))],
                       microbatches=list(st["microbatches"]),
                       extra={"run_dir": str(self.run_dir), "completed": st["completed"], "faults": st["faults"]})

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Carry out one action (the request file is named by the action id)."""
        p = request.params
        if request.strategy == "rebalance":
            counts = [int(c) for c in p.get("counts") or []]
            frm = self._request("set_microbatches", request.id, counts=counts)
            return ActionOutcome(True, f"micro-batches {counts} from iteration {frm}",
                                 {"counts": counts, "from_iteration": frm}, pause_s=0.0, iterations_lost=0)
        if request.strategy in ("restart", "topology"):
            before = self.status()
            if request.strategy == "topology":
                placement = [int(x) for x in p.get("placement") or []]
            else:
                names = [node_name(i) for i in range(int(before["num_nodes"]))]
                unknown = [n for n in p.get("exclude_nodes") or [] if n not in names]
                if unknown:
                    raise AdapterError(f"nodes {unknown} are not nodes of this job ({names})")
                bad = {names.index(n) for n in p.get("exclude_nodes") or []}
                placement = move_off(list(before["placement"]), int(before["num_nodes"]), bad)
            resumed = self._request("restart", request.id, placement=placement)
            return self._after_restart(request, before, placement, int(resumed))
        raise AdapterError(f"the testbed adapter cannot {request.strategy}")

    def _after_restart(self, request: ActionRequest, before: dict[str, Any], placement: list[int],
                       resumed: int) -> ActionOutcome:
        """Wait for the first iteration after the restart and measure the pause it caused."""
        deadline = time.monotonic() + self.progress_timeout_s
        st = self.status()
        while st["completed"] <= resumed and time.monotonic() < deadline:
            time.sleep(0.2)
            st = self.status()
        lost = max(0, int(before["completed"]) - resumed)
        pause = None
        if st["completed"] > resumed and st.get("last_iteration_end_unix") and before.get("last_iteration_end_unix"):
            # one iteration of the gap is the iteration itself; the rest is the pause
            typical = float(before.get("recent_iteration_s") or 0.0)
            pause = max(0.0, float(st["last_iteration_end_unix"]) - float(before["last_iteration_end_unix"])
                        - typical * (int(st["completed"]) - int(before["completed"])))
        ok = st["completed"] > resumed
        detail = (f"restarted at iteration {resumed} with placement {placement}"
                  + ("" if ok else f"; no iteration within {self.progress_timeout_s:.0f} s after it"))
        return ActionOutcome(ok, detail, {"placement": placement, "resumed_iteration": resumed,
                                          "previous_placement": before["placement"]},
                             pause_s=pause, iterations_lost=lost)

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """The job's answer to the action's request file, waiting for it while the job still works on it."""
        client = self._client()
        # Not answered yet: the launcher may be working on it (it removes the request file when it starts),
        # or the remediator died before writing it; only the answer can tell, so wait for it.
        try:
            client.wait(request.id, timeout_s=self.timeout_s)
        except ControlTimeout:
            return None
        except InputError:
            pass  # refused: the answer says why
        ans = client.answer(request.id)
        if ans is None:
            return None
        if not ans.get("ok"):
            return ActionOutcome(False, f"testbed refused {request.strategy}: {ans.get('error')}")
        return ActionOutcome(True, f"{request.strategy} done before the remediator restarted: {ans.get('result')}",
                             {"result": ans.get("result")})
