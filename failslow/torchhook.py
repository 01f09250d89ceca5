"""torch.distributed hook: writes one ring record per collective / point-to-point call, for any backend.

This is the framework-level tracking path (gloo on CPU here, NCCL on GPUs): it wraps the Python
functions of ``torch.distributed`` (all_reduce, all_gather(_single/_into_tensor), reduce_scatter(_single/
_tensor), broadcast, reduce, all_to_all(_single), gather, scatter, send, recv, isend, irecv,
batch_isend_irecv, barrier, monitored_barrier, the coalesced variants) and writes records of the shared
ring format (`failslow.ring`) with host start/end times and a stable communicator id per process group.

Install it with one call, ``failslow.torchhook.install()``, or set ``FAILSLOW_TORCH_HOOK=1`` and call
``failslow.torchhook.install_from_env()`` at the top of the training script. torch is imported lazily:
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
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from failslow import ring
from failslow.errors import InputError
from failslow.ring import Control, Flag, Op, RingWriter

# name -> (op, name of the tensor argument that gives count/bytes, root/peer parameter (global, group))
_SPECS: Final[dict[str, tuple[Op, str, tuple[str, str] | None]]] = {
    "all_reduce": (Op.ALLREDUCE, "tensor", None),
    "all_reduce_coalesced": (Op.ALLREDUCE, "tensors", None),
    "broadcast": (Op.BROADCAST, "tensor", ("src", "group_src")),
    "reduce": (Op.REDUCE, "tensor", ("dst", "group_dst")),
    "all_gather": (Op.ALLGATHER, "tensor", None),
    "all_gather_single": (Op.ALLGATHER, "input_tensor", None),
    "all_gather_into_tensor": (Op.ALLGATHER, "input_tensor", None),
    "_all_gather_base": (Op.ALLGATHER, "input_tensor", None),
    "all_gather_coalesced": (Op.ALLGATHER, "input_tensor_list", None),
    "reduce_scatter": (Op.REDUCESCATTER, "output", None),
    "reduce_scatter_single": (Op.REDUCESCATTER, "output", None),
    "reduce_scatter_tensor": (Op.REDUCESCATTER, "output", None),
    "_reduce_scatter_base": (Op.REDUCESCATTER, "output", None),
    "all_to_all": (Op.ALLTOALL, "input_tensor_list", None),
    "all_to_all_single": (Op.ALLTOALL, "input", None),
    "gather": (Op.GATHER, "tensor", ("dst", "group_dst")),
    "scatter": (Op.SCATTER, "tensor", ("src", "group_src")),
    "send": (Op.SEND, "tensor", ("dst", "group_dst")),
    "recv": (Op.RECV, "tensor", ("src", "group_src")),
    "isend": (Op.SEND, "tensor", ("dst", "group_dst")),
    "irecv": (Op.RECV, "tensor", ("src", "group_src")),
    "barrier": (Op.BARRIER, "", None),
    "monitored_barrier": (Op.BARRIER, "", None),
}
_ALWAYS_ASYNC: Final[frozenset[str]] = frozenset({"isend", "irecv"})

# torch dtype name -> ncclDataType_t number (the record's dtype field)
_DTYPES: Final[dict[str, int]] = {
    "torch.int8": 0, "torch.uint8": 1, "torch.bool": 1, "torch.int32": 2, "torch.uint32": 3, "torch.int64": 4,
    "torch.uint64": 5, "torch.float16": 6, "torch.float32": 7, "torch.float64": 8, "torch.bfloat16": 9,
    "torch.float8_e4m3fn": 10, "torch.float8_e5m2": 11,
}

_DTYPE_CACHE: dict[Any, int] = {}  # torch.dtype -> code, filled on first sight (str() per call is slow)

_DEFAULT_SUSPEND_TIMEOUT_MS: Final[int] = 30_000


@dataclass(frozen=True)
class CommInfo:
    """What the hook knows about one process group."""

    comm: int  # stable id, identical on every member rank
    nranks: int
    comm_rank: int
    global_to_group: Mapping[int, int]


def comm_id(group_name: str, ranks: list[int] | tuple[int, ...]) -> int:
    """Stable 64-bit communicator id of a process group, the same on every member.

    torch names groups in creation order (every rank calls ``new_group`` in the same order, so the
    ``group_name`` agrees) or by a hash of their ranks; adding the sorted global ranks keeps two
    groups apart even if a backend reuses names.
    """
    key = f"torch|{group_name}|{','.join(str(r) for r in sorted(ranks))}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class _Hook:
    """State of the installed hook: originals, the ring writer, per-group facts."""

    def __init__(self, job: str | None, rank: int | None, layout: Any, directory: str | None,
                 capacity: int) -> None:
        self.job = job
        self.rank = rank
        self.layout = layout
        self.directory = directory
        self.capacity = capacity
        self.originals: dict[tuple[Any, str], Any] = {}
        self.writer: RingWriter | None = None
        self.writer_pid = 0
        self.writer_ok = False  # writer is this process's and usable; reset in forked children
        self.lock = threading.Lock()
        self.comms: dict[Any, CommInfo] = {}
        self.tls = threading.local()
        from torch.distributed import distributed_c10d

        self.c10d = distributed_c10d

    # -- ring ---------------------------------------------------------------------------------------
    def get_writer(self) -> RingWriter | None:
        """This process's ring writer, created at the first call; None if the ring cannot be made."""
        pid = os.getpid()
        if self.writer_pid == pid:
            return self.writer
        with self.lock:
            if self.writer_pid == pid:
                return self.writer
            import torch.distributed as dist

            rank, ws = self.rank, None
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                ws = dist.get_world_size()
            pid = os.getpid()
            # the C shim owns failslow-<pid>.ring; never share a ring with it
            tag = "torch" if _shim_ring_exists(pid, self.directory) else ""
            try:
                self.writer = RingWriter.create(directory=self.directory, job=self.job, rank=rank,
                                                world_size=ws, layout=self.layout, capacity=self.capacity,
                                                producer=ring.Producer.TORCH, tag=tag)
            except Exception:  # tracking must never break training: give up recording in this process
                self.writer = None
            self.writer_pid = pid
            self.writer_ok = self.writer is not None
            return self.writer

    def after_fork_in_child(self) -> None:
        # the parent's ring belongs to the parent: the child makes its own at its first call
        self.writer = None
        self.writer_ok = False
        self.writer_pid = 0

    # -- groups -------------------------------------------------------------------------------------
    def comm_info(self, group: Any) -> CommInfo | None:
        if group is None:
            pg = self.c10d._world._default_pg
            if pg is None:
                return None
        else:
            pg = group
        info = self.comms.get(pg)
        if info is not None:
            return info
        import torch.distributed as dist

        c10d = self.c10d

        if pg == c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = list(dist.get_process_group_ranks(pg))
        name = str(getattr(pg, "group_name", "") or c10d._world.pg_names.get(pg, ""))
        info = CommInfo(comm=comm_id(name, ranks), nranks=int(pg.size()), comm_rank=int(pg.rank()),
                        global_to_group={g: i for i, g in enumerate(ranks)})
        self.comms[pg] = info
        return info


_hook: _Hook | None = None
_install_lock = threading.Lock()


def _shim_ring_exists(pid: int, directory: str | None) -> bool:
    # the shim creates its ring at the first NCCL call, which may come after ours: LD_PRELOAD tells us early
    if "failslow_shim" in os.environ.get("LD_PRELOAD", ""):
        return True
    p = ring.ring_path(pid, directory)
    try:
        return ring.read_header(p).producer == ring.Producer.SHIM
    except Exception:
        return False


def _numel_bytes(x: Any) -> tuple[int, int, int]:
    """(elements, bytes, nccl dtype) of a tensor or a (nested) list of tensors."""
    if x is None:
        return 0, 0, ring.DTYPE_UNKNOWN
    if isinstance(x, list | tuple):
        n = b = 0
        dt = ring.DTYPE_UNKNOWN
        for t in x:
            n1, b1, dt1 = _numel_bytes(t)
            n, b = n + n1, b + b1
            dt = dt1 if dt == ring.DTYPE_UNKNOWN else dt
        return n, b, dt
    dt = x.dtype
    code = _DTYPE_CACHE.get(dt)
    if code is None:
        code = _DTYPE_CACHE[dt] = _DTYPES.get(str(dt), ring.DTYPE_UNKNOWN)
    return x.numel(), x.nbytes, code


class _ArgReader:
    """Fast positional/keyword argument lookup for one wrapped function (no inspect.bind per call)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import inspect

        sig = inspect.signature(fn)
        self.index = {name: i for i, name in enumerate(sig.parameters)}
        self.default = {name: p.default for name, p in sig.parameters.items()
                        if p.default is not inspect.Parameter.empty}

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self.index.get(name)
        if i is not None and i < len(args):
            return args[i]
        return self.default.get(name)

    def pos(self, name: str) -> tuple[int, Any]:
        """(positional index, default) of a parameter; an absent one is never positional, default None."""
        return self.index.get(name, 1 << 30), self.default.get(name)


def _suspend_wait(w: RingWriter) -> int:
    """Hold the calling thread while a controller has set SUSPEND (bounded); returns flags to add."""
    limit_ms = w.suspend_timeout_ms() or _DEFAULT_SUSPEND_TIMEOUT_MS
    deadline = time.monotonic() + limit_ms / 1000.0
    w.add_suspended(1)
    try:
        while w.control() & Control.SUSPEND:
            if time.monotonic() >= deadline:
                return int(Flag.SUSPENDED | Flag.SUSPEND_TIMEOUT)
            time.sleep(0.001)
    finally:
        w.add_suspended(-1)
    return int(Flag.SUSPENDED)


_HOST: Final[int] = int(Flag.HOST_TIMES)
_ASYNC: Final[int] = int(Flag.ASYNC)
_ERROR: Final[int] = int(Flag.ERROR)
_SUSPEND: Final[int] = int(Control.SUSPEND)


def _make_wrapper(h: _Hook, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    op, tensor_arg, peer_args = _SPECS[name]
    reader = _ArgReader(orig)
    always_async = name in _ALWAYS_ASYNC
    tls = h.tls
    mono = time.monotonic_ns
    is_recv = op == Op.RECV
    op_i = int(op)

    gi, gd = reader.pos("group")
    ai, ad = reader.pos("async_op")
    ti, td = reader.pos(tensor_arg) if tensor_arg else (1 << 30, None)
    pgi, pgd = reader.pos(peer_args[1]) if peer_args else (1 << 30, None)
    pni, pnd = reader.pos(peer_args[0]) if peer_args else (1 << 30, None)
    g_name, t_name = "group", tensor_arg
    pg_name, pn_name = (peer_args[1], peer_args[0]) if peer_args else ("", "")

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(tls, "depth", 0):
            return orig(*args, **kwargs)  # nested inside a recorded call: recorded once, outside
        t0 = mono()
        n = len(args)
        try:
            w = h.writer if h.writer_ok else h.get_writer()
            group = args[gi] if gi < n else (kwargs.get(g_name, gd) if kwargs else gd)
            info = h.comm_info(group) if w is not None else None
        except Exception:
            w, info = None, None
        if w is None or info is None:
            return orig(*args, **kwargs)
        flags = _HOST
        ctl, ci = w.control_word
        if ctl[ci] & _SUSPEND:
            flags |= _suspend_wait(w)
            t0 = mono()
        is_async = always_async or bool(args[ai] if ai < n else (kwargs.get("async_op", ad) if kwargs else ad))
        if is_async:
            flags |= _ASYNC
        peer = -1
        try:
            if tensor_arg:
                count, nbytes, dtype = _numel_bytes(args[ti] if ti < n else (kwargs.get(t_name, td) if kwargs else td))
            else:
                count, nbytes, dtype = 0, 0, 255
            if peer_args is not None:
                g = args[pgi] if pgi < n else (kwargs.get(pg_name, pgd) if kwargs else pgd)
                if g is None:
                    glob = args[pni] if pni < n else (kwargs.get(pn_name, pnd) if kwargs else pnd)
                    g = info.global_to_group.get(int(glob), -1) if glob is not None else -1
                peer = int(g)
            tid = getattr(tls, "tid", 0)
            if not tid:
                tid = tls.tid = threading.get_native_id()
            # async work is claimed now (keeps issue order) and committed at completion; a synchronous call
            # is written whole when it returns, so a call blocked behind a straggler is never a pending slot
            seq = (w.begin(op_i, info.comm, info.nranks, info.comm_rank, peer, count, nbytes, dtype, t0, t0,
                           flags=flags, tid=tid) if is_async else -1)
        except Exception:
            seq = 0
        tls.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            t1 = mono()
            try:
                if seq > 0:
                    w.finish(seq, t_end_ns=t1, t_return_ns=t1, add_flags=_ERROR)
                elif seq < 0:
                    w.append(op_i, info.comm, info.nranks, info.comm_rank, peer, count, nbytes, dtype, t0, t0, t1,
                             flags | _ERROR, t_return_ns=t1, tid=tid)
            except Exception:
                pass
            raise
        finally:
            tls.depth = 0
        t1 = mono()
        if not seq:
            return result
        try:
            if seq < 0:
                if is_recv and peer == -1 and isinstance(result, int) and result >= 0:
                    peer = info.global_to_group.get(result, -1)
                w.append(op_i, info.comm, info.nranks, info.comm_rank, peer, count, nbytes, dtype, t0, t0, t1, flags,
                         t_return_ns=t1, tid=tid)
                return result
            if result is None:  # not part of the group after all
                w.finish(seq, t_return_ns=t1, add_flags=_ERROR)
                return result
        except Exception:
            return result
        return _track_completion(w, seq, t1, result)

    wrapper.__name__ = getattr(orig, "__name__", name)
    wrapper.__qualname__ = getattr(orig, "__qualname__", name)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper._failslow_hook = True  # type: ignore[attr-defined]
    return wrapper


class _Once:
    """Commits a deferred record exactly once (future callback, wait, is_completed, or GC)."""

    __slots__ = ("done", "flags", "lock", "seq", "t_return", "w")

    def __init__(self, w: RingWriter, seq: int, t_return: int, flags: int = 0) -> None:
        self.w, self.seq, self.t_return, self.flags = w, seq, t_return, flags
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, *_: Any, flags: int = 0) -> None:
        t = time.monotonic_ns()
        with self.lock:
            if self.done:
                return
            self.done = True
        self.w.finish(self.seq, t_end_ns=t, t_return_ns=self.t_return, add_flags=self.flags | flags)


def _track_completion(w: RingWriter, seq: int, t_return: int, work: Any) -> Any:
    try:
        fut = work.get_future()
    except Exception:
        fut = None
    if fut is not None:
        try:
            fut.add_done_callback(_Once(w, seq, t_return))
            return work
        except Exception:
            pass
    return _traced_work_class()(work, _Once(w, seq, t_return, int(Flag.END_AT_WAIT)))


_TRACED_WORK: type | None = None


def _traced_work_class() -> type:
    """A `torch.distributed.Work` subclass that forwards to the real work and notes completion."""
    global _TRACED_WORK
    if _TRACED_WORK is not None:
        return _TRACED_WORK
    import torch.distributed as dist

    class TracedWork(dist.Work):  # type: ignore[misc,unused-ignore]
        """Work handle returned for async calls whose backend work has no future (gloo send/recv)."""

        def __init__(self, inner: Any, done: _Once) -> None:
            super().__init__()
            self._inner = inner
            self._done = done

        def wait(self, *a: Any, **k: Any) -> Any:
            try:
                r = self._inner.wait(*a, **k)
            except BaseException:
                self._done(flags=int(Flag.ERROR))
                raise
            self._done()
            return r

        def is_completed(self) -> bool:
            c = bool(self._inner.is_completed())
            if c:
                self._done()
            return c

        def __del__(self) -> None:
            # never waited on: commit anyway so the reader is not held back (end unknown)
            d = self._done
            with d.lock:
                if d.done:
                    return
                d.done = True
            d.w.finish(d.seq, t_return_ns=d.t_return)

        def is_success(self) -> Any:
            return self._inner.is_success()

        def exception(self) -> Any:
            return self._inner.exception()

        def source_rank(self) -> Any:
            return self._inner.source_rank()

        def _source_rank(self) -> Any:
            return self._inner._source_rank()

        def result(self) -> Any:
            return self._inner.result()

        def synchronize(self) -> Any:
            return self._inner.synchronize()

        def get_future(self) -> Any:
            return self._inner.get_future()

        def get_future_result(self) -> Any:
            return self._inner.get_future_result()

        def block_current_stream(self) -> Any:
            return self._inner.block_current_stream()

        def boxed(self) -> Any:
            return self._inner.boxed()

        def _get_duration(self) -> Any:
            return self._inner._get_duration()

        def _get_op_type(self) -> Any:
            return self._inner._get_op_type()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    _TRACED_WORK = TracedWork
    return TracedWork


def _make_batch_wrapper(h: _Hook, orig: Callable[..., Any]) -> Callable[..., Any]:
    """batch_isend_irecv: one SEND/RECV record per op (flag IN_GROUP), ends at each op's completion."""

    def wrapper(p2p_op_list: Any) -> Any:
        tls = h.tls
        if getattr(tls, "depth", 0):
            return orig(p2p_op_list)
        t0 = time.monotonic_ns()
        seqs: list[int] = []
        w = None
        try:
            from torch.distributed import distributed_c10d as c10d

            # P2POps built with the unwrapped isend/irecv would confuse torch's own `op is isend` test
            for p in p2p_op_list:
                for nm in ("isend", "irecv"):
                    if p.op is h.originals.get((c10d, nm)) or p.op is h.originals.get((_dist_mod(), nm)):
                        p.op = getattr(c10d, nm)
            w = h.get_writer()
            if w is not None:
                for p in p2p_op_list:
                    info = h.comm_info(p.group)
                    if info is None:
                        continue
                    fn = getattr(p.op, "__wrapped__", p.op)
                    is_send = fn is h.originals.get((c10d, "isend"))
                    n, b, dt = _numel_bytes(p.tensor)
                    peer = getattr(p, "group_peer", None)
                    if peer is None:
                        peer = info.global_to_group.get(int(p.peer), -1)
                    seqs.append(w.begin(Op.SEND if is_send else Op.RECV, info.comm, info.nranks, info.comm_rank,
                                        int(peer), n, b, dt, t0, t0,
                                        flags=int(Flag.HOST_TIMES | Flag.ASYNC | Flag.IN_GROUP)))
        except Exception:
            pass
        tls.depth = 1
        try:
            works = orig(p2p_op_list)
        except BaseException:
            t1 = time.monotonic_ns()
            for s in seqs:
                if w is not None:
                    w.finish(s, t_end_ns=t1, t_return_ns=t1, add_flags=int(Flag.ERROR))
            raise
        finally:
            tls.depth = 0
        t1 = time.monotonic_ns()
        if w is None or not seqs:
            return works
        if len(works) == len(seqs):
            return [_track_completion(w, s, t1, wk) if s else wk for s, wk in zip(seqs, works, strict=True)]
        # coalesced backends return fewer works than ops: every op ends when the last work completes
        if not works:
            for s in seqs:
                w.finish(s, t_end_ns=t1, t_return_ns=t1)
            return works
        out = list(works)
        last = _track_completion(w, seqs[0], t1, out[-1])
        for s in seqs[1:]:
            w.finish(s, t_return_ns=t1)  # end unknown individually; the first record carries it
        out[-1] = last
        return out

    wrapper.__name__ = "batch_isend_irecv"
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper._failslow_hook = True  # type: ignore[attr-defined]
    return wrapper


def _dist_mod() -> Any:
    import torch.distributed as dist

    return dist


def install(job: str | None = None, rank: int | None = None, layout: Any = None, *,
            directory: str | None = None, capacity: int = ring.DEFAULT_CAPACITY) -> None:
    """Wrap torch.distributed's collectives and p2p calls so each writes a ring record (idempotent).

    Args:
        job: Job id for the ring header (default: from the environment, see `failslow.ring.env_identity`).
        rank: Global rank (default: ``torch.distributed.get_rank()`` at the first call, else ``RANK``).
        layout: Parallel layout (a `failslow.topology.Layout` or a mapping with tp/pp/dp/cp) for the header.
        directory: Ring directory (default ``$FAILSLOW_SHM_DIR`` or ``/dev/shm``).
        capacity: Records in the ring (power of two).
    """
    global _hook
    with _install_lock:
        if _hook is not None:
            return
        ring._check_capacity(capacity)
        if layout is not None:
            ring._layout_sizes(layout)
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
        raise RuntimeError("failslow.torchhook is not installed in this process: call install() first")
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
        cap = int(cap_s) if cap_s else ring.DEFAULT_CAPACITY
    except ValueError as exc:
        raise InputError(f"FAILSLOW_RING_CAPACITY={cap_s!r} is not an integer") from exc
    install(capacity=cap)
    return True
