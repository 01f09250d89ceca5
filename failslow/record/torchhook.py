"""torch.distributed hook: writes one ring record per collective / point-to-point call, for any backend.

This is the framework-level tracking path (gloo on CPU here, NCCL on GPUs): it wraps the Python
functions of ``torch.distributed`` (all_reduce, all_gather(_single/_into_tensor), reduce_scatter(_single/
_tensor), broadcast, reduce, all_to_all(_single), gather, scatter, send, recv, isend, irecv,
batch_isend_irecv, barrier, monitored_barrier, the coalesced variants) and writes records of the shared
ring format (`failslow.record`) with host start/end times and a stable communicator id per process group.

Install it with one call, ``failslow.record.torchhook.install()``, or set ``FAILSLOW_TORCH_HOOK=1`` and call
``failslow.record.torchhook.install_from_env()`` at the top of the training script. torch is imported lazily:
importing this module does not import torch.

What "end" means (``record.t_end_ns``):
  * synchronous calls: when the Python call returned. With gloo that is when the collective finished on
    this rank; with NCCL it is only when the work was enqueued on the GPU stream (use the C shim's GPU
    timing for kernel times).
  * ``async_op=True`` work: when completion was observed. Collectives whose work has a future (gloo
    all_reduce, broadcast, ...) get the future's completion callback — the real completion time on the
    host. Work without a future (gloo send/recv) is handed back wrapped; its end is the first
    ``wait()`` return or ``is_completed()`` that returned True (flag ``END_AT_WAIT``: an upper bound).
    The record is committed only then, so it keeps its place in issue order.

Limits: calls made from C++ (DDP's reducer, torch.compile'd functional collectives) never pass through
Python and are not seen — use the NCCL shim for those. Names bound before `install` (``from
torch.distributed import all_reduce``, ``P2POp(isend, ...)`` built earlier) keep the unwrapped function.
Nested calls (``send`` calling ``isend``, object collectives calling tensor collectives) are recorded
once, at the outermost call the user made.

The wrappers live in `failslow.record.torchwrap`, the per-group bookkeeping in `failslow.record.torchcomm`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from failslow.errors import InputError
from failslow.record.layout import DEFAULT_CAPACITY, _check_capacity, _layout_sizes
from failslow.record.torchcomm import CommInfo, _Hook, comm_id
from failslow.record.torchwrap import _SPECS, _make_batch_wrapper, _make_wrapper

__all__ = ["CommInfo", "comm_id", "install", "install_from_env", "installed", "ring_file", "uninstall", "wrap"]

_hook: _Hook | None = None
_install_lock = threading.Lock()


def install(job: str | None = None, rank: int | None = None, layout: Any = None, *,
            directory: str | None = None, capacity: int = DEFAULT_CAPACITY) -> None:
    """Wrap torch.distributed's collectives and p2p calls so each writes a ring record (idempotent).

    Args:
        job: Job id for the ring header (default: from the environment, see `failslow.record.env_identity`).
        rank: Global rank (default: ``torch.distributed.get_rank()`` at the first call, else ``RANK``).
        layout: Parallel layout (a `failslow.topology.Layout` or a mapping with tp/pp/dp/cp) for the header.
        directory: Ring directory (default ``$FAILSLOW_SHM_DIR`` or ``/dev/shm``).
        capacity: Records in the ring (power of two).
    """
    global _hook
    with _install_lock:
        if _hook is not None:
            return
        _check_capacity(capacity)
        if layout is not None:
            _layout_sizes(layout)
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        h = _Hook(job, rank, layout, directory, capacity)
        wrappers: dict[str, Callable[..., Any]] = {}
        for name in [*_SPECS, "batch_isend_irecv"]:
            orig = getattr(c10d, name, None)
            if orig is None or getattr(orig, "_failslow_hook", False):
                continue
            wrappers[name] = (_make_batch_wrapper(h, orig) if name == "batch_isend_irecv"
                              else _make_wrapper(h, name, orig))
            h.originals[(c10d, name)] = orig
        for mod in (c10d, dist):
            for name, wrap in wrappers.items():
                cur = getattr(mod, name, None)
                if cur is not None and cur is h.originals[(c10d, name)]:
                    if mod is not c10d:
                        h.originals[(mod, name)] = cur
                    setattr(mod, name, wrap)
        _hook = h
        os.register_at_fork(after_in_child=h.after_fork_in_child)
        import atexit

        atexit.register(_at_exit)


def _at_exit() -> None:
    h = _hook
    if h is None or h.writer is None or h.writer_pid != os.getpid():
        return
    keep = os.environ.get("FAILSLOW_KEEP_RINGS", "").strip() not in ("", "0")
    h.writer.close(unlink=not keep)


def uninstall(unlink: bool = True) -> None:
    """Restore the original torch.distributed functions and close the ring (for tests and benchmarks)."""
    global _hook
    with _install_lock:
        h = _hook
        if h is None:
            return
        for (mod, name), orig in h.originals.items():
            setattr(mod, name, orig)
        if h.writer is not None and h.writer_pid == os.getpid():
            h.writer.close(unlink=unlink)
        _hook = None


def installed() -> bool:
    """Whether the hook is installed in this process."""
    return _hook is not None


def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` recorded as the collective `name` (``all_reduce``, ``broadcast`` …, with torch.distributed's
    signature) by the installed hook, the way :func:`install` wraps torch.distributed's own: for a
    collective of a library that does not go through ``torch.distributed``, or to time the hook alone
    around a function that does nothing. Raises RuntimeError when the hook is not installed."""
    h = _hook
    if h is None:
        raise RuntimeError("failslow.record.torchhook is not installed in this process: call install() first")
    return _make_wrapper(h, name, fn)


def ring_file() -> str | None:
    """Path of the ring this process writes (None before the first recorded call)."""
    h = _hook
    return str(h.writer.path) if h is not None and h.writer is not None else None


def install_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Install the hook when ``FAILSLOW_TORCH_HOOK=1`` (true, yes, on); returns whether it is installed.

    ``FAILSLOW_RING_CAPACITY`` sets the ring size. Job, rank and layout come from the environment.
    """
    e = os.environ if env is None else env
    if e.get("FAILSLOW_TORCH_HOOK", "").strip().lower() not in ("1", "true", "yes", "on"):
        return installed()
    cap_s = e.get("FAILSLOW_RING_CAPACITY", "").strip()
    try:
        cap = int(cap_s) if cap_s else DEFAULT_CAPACITY
    except ValueError as exc:
        raise InputError(f"FAILSLOW_RING_CAPACITY={cap_s!r} is not an integer") from exc
    install(capacity=cap)
    return True
