"""The framework-adapter interface mitigation uses, and its testbed implementations.

Mitigation (the remediator's S2–S4 actions) needs three knobs on a running job, whatever framework
runs it:

* **micro-batch redistribution** — how many micro-batches each DP replica runs per iteration; the
  loss of each micro-batch is divided by the total so the global-batch gradient is unchanged while
  the total stays the same (a slow replica gets fewer, fast ones more; the split itself comes from
  the exact solver :func:`failslow.plan.rebalance`);
* **checkpoint** — save model and optimizer state now (from a near-future iteration boundary);
* **restart with a new placement** — checkpoint, stop, start again from the checkpoint with a
  different rank-to-node mapping (move a rank off a slow node or link).

:class:`TrainingAdapter` is that interface. Two implementations talk to the testbed:

* :class:`TestbedAdapter` wraps a :class:`testbed.launcher.Testbed` in the same process;
* :class:`FileControlAdapter` speaks the run directory's request/response file protocol, so a
  process that must not import the testbed (the remediator service) can drive a running
  ``failslow testbed run --run-dir DIR``. The protocol is plain JSON (docs/testbed.md):
  write ``DIR/requests/<id>.json`` = ``{"id", "action", ...args}`` (atomically: write then rename),
  read ``DIR/responses/<id>.json`` = ``{"id", "ok": bool, "result" | "error"}``. Actions:
  ``set_microbatches {counts}``, ``checkpoint {dir}``, ``restart {placement, dir?}``,
  ``inject {spec}``, ``remove {spec}``, ``status {}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from failslow.control import RunDirClient
from failslow.topology import Layout


@runtime_checkable
class TrainingAdapter(Protocol):
    """The knobs mitigation turns on a running training job."""

    def layout(self) -> Layout:
        """The job's parallel layout."""
        ...

    def placement(self) -> list[int]:
        """Node of each rank, indexed by global rank."""
        ...

    def set_microbatches(self, counts: Sequence[int]) -> int:
        """Micro-batches per DP replica from the next safe iteration (returned)."""
        ...

    def save_checkpoint(self, directory: str | Path) -> int:
        """Save a checkpoint; returns the iteration a restart resumes from."""
        ...

    def restart(self, placement: Sequence[int] | None = None, directory: str | Path | None = None) -> int:
        """Checkpoint, stop and restart with `placement`; returns the iteration resumed from."""
        ...


class TestbedAdapter:
    """:class:`TrainingAdapter` over a :class:`testbed.launcher.Testbed` in this process."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, testbed: Any) -> None:
        self.tb = testbed

    def layout(self) -> Layout:
        return self.tb.layout  # type: ignore[no-any-return]

    def placement(self) -> list[int]:
        return list(self.tb.placement)

    def set_microbatches(self, counts: Sequence[int]) -> int:
        return int(self.tb.set_microbatches(counts))

    def save_checkpoint(self, directory: str | Path) -> int:
        return int(self.tb.checkpoint(directory))

    def restart(self, placement: Sequence[int] | None = None, directory: str | Path | None = None) -> int:
        return int(self.tb.restart(placement, directory))


class FileControlAdapter:
    """:class:`TrainingAdapter` over the request/response files of a running testbed's run directory."""

    def __init__(self, run_dir: str | Path, timeout_s: float = 180.0) -> None:
        self.client = RunDirClient(run_dir, timeout_s)
        self.run_dir, self.timeout_s = self.client.run_dir, timeout_s

    def request(self, action: str, **args: Any) -> Any:
        """Send one request and wait for its response; returns the result.

        Raises:
            InputError: the testbed refused the request (its message).
            TimeoutError: no response within the timeout (testbed gone or busy).
        """
        return self.client.request(action, **args)

    def layout(self) -> Layout:
        return Layout.from_mapping(self.request("status")["layout"])

    def placement(self) -> list[int]:
        return list(self.request("status")["placement"])

    def set_microbatches(self, counts: Sequence[int]) -> int:
        return int(self.request("set_microbatches", counts=list(counts)))

    def save_checkpoint(self, directory: str | Path) -> int:
        return int(self.request("checkpoint", dir=str(directory)))

    def restart(self, placement: Sequence[int] | None = None, directory: str | Path | None = None) -> int:
        return int(self.request("restart", placement=None if placement is None else list(placement),
                                dir=None if directory is None else str(directory)))
