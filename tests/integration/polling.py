"""The integration tests' one polling helper: wait until a condition holds, or fail saying what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["run_until", "wait_for"]

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float, what: str, *, every: float = 0.3,
             ignore: tuple[type[BaseException], ...] = (),
             on_timeout: Callable[[], str] | None = None) -> T:
    """Call `pred()` every `every` seconds until it returns something truthy, and return that.

    An exception of a type in `ignore` raised by `pred` counts as "not yet"; any other propagates. After
    `timeout` seconds without a truthy value, raise AssertionError naming `what`, the timeout and the last
    ignored exception, followed by `on_timeout()`'s text (diagnostics: logs, a process's state) if given.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            got = pred()
        except ignore as e:
            last = e
        else:
            if got:
                return got
        if time.monotonic() >= deadline:
            break
        time.sleep(every)
    msg = f"{what} not reached within {timeout} s"
    if last is not None:
        msg += f" (last error: {type(last).__name__}: {last})"
    if on_timeout is not None:
        msg += "\n" + on_timeout()
    raise AssertionError(msg)


def run_until(tb: Any, done: int, timeout_s: float = 120.0) -> None:
    """Drive a testbed job (`testbed.launcher.Testbed`: its polls run the fault schedules) until `done`
    iterations are complete."""
    def reached() -> bool:
        tb.poll()
        return bool(tb.completed() >= done)

    wait_for(reached, timeout_s, f"iteration {done} of the job", every=0.05)
