"""The call wrappers of the torch.distributed hook: one ring record per collective / p2p call.

`_make_wrapper` wraps one torch.distributed function (sync and async calls, SUSPEND, errors);
`_make_batch_wrapper` wraps ``batch_isend_irecv`` (one record per op); async work is committed at its
completion (`_track_completion`: the work's future, else a `TracedWork` handle that notes ``wait()``).
Installed by `failslow.record.torchhook`; torch is imported only when a wrapper is built or called.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final

from failslow.record.layout import DTYPE_UNKNOWN, Control, Flag, Op
from failslow.record.torchcomm import _Hook
from failslow.record.writer import RingWriter

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


def _numel_bytes(x: Any) -> tuple[int, int, int]:
    """(elements, bytes, nccl dtype) of a tensor or a (nested) list of tensors."""
    if x is None:
        return 0, 0, DTYPE_UNKNOWN
    if isinstance(x, list | tuple):
        n = b = 0
        dt = DTYPE_UNKNOWN
        for t in x:
            n1, b1, dt1 = _numel_bytes(t)
            n, b = n + n1, b + b1
            dt = dt1 if dt == DTYPE_UNKNOWN else dt
        return n, b, dt
    dt = x.dtype
    code = _DTYPE_CACHE.get(dt)
    if code is None:
        code = _DTYPE_CACHE[dt] = _DTYPES.get(str(dt), DTYPE_UNKNOWN)
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
