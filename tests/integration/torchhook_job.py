"""A small real gloo job used by test_torchhook.py: one process per rank, launched with RANK/WORLD_SIZE.

It installs the hook from the environment (FAILSLOW_TORCH_HOOK=1), runs a fixed script of collectives and
p2p calls, and writes what it did (op, group, expected count/peer, host time bounds) to $OUT/rank<r>.json so
the test can check every record against the ground truth.
"""

from __future__ import annotations

import json
import os
import sys
import time

import failslow.record.torchhook as th


def _opt_in_checks() -> dict[str, object]:
    """install_from_env is opt-in, validates its input, and nothing imports torch before it is needed."""
    from failslow.errors import InputError

    out: dict[str, object] = {"torch_imported_early": "torch" in sys.modules}
    out["off_without_env"] = th.install_from_env({}) is False and not th.installed()
    try:
        th.install_from_env({"FAILSLOW_TORCH_HOOK": "1", "FAILSLOW_RING_CAPACITY": "100"})
        out["bad_capacity"] = "accepted"
    except InputError as exc:
        out["bad_capacity"] = str(exc)
    out["still_off"] = not th.installed()
    try:
        th.wrap("all_reduce", print)
        out["wrap_needs_install"] = False
    except RuntimeError:
        out["wrap_needs_install"] = True
    return out


def main() -> int:
    checks = _opt_in_checks()
    installed = th.install_from_env()
    th.install()  # idempotent
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    checks["wrapped_both_modules"] = (dist.all_reduce is c10d.all_reduce
                                      and getattr(dist.all_reduce, "_failslow_hook", False)
                                      and dist.all_reduce.__wrapped__.__name__ == "all_reduce")

    def noop(tensor, op=None, group=None, async_op=False):  # type: ignore[no-untyped-def]
        return None

    wrapped = th.wrap("all_reduce", noop)  # never called: it would add a record
    checks["wrap_is_hooked"] = bool(getattr(wrapped, "_failslow_hook", False)) and wrapped.__wrapped__ is noop
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    log: list[dict[str, object]] = []

    def step(op: str, group: str, count: int, peer: int, fn, *, nbytes: int | None = None) -> object:  # type: ignore[no-untyped-def]
        t0 = time.monotonic_ns()
        r = fn()
        t1 = time.monotonic_ns()
        log.append({"op": op, "group": group, "count": count, "bytes": 4 * count if nbytes is None else nbytes,
                    "peer": peer, "t0": t0, "t1": t1})
        return r

    pair = dist.new_group([0, 1])  # every rank creates every group, in the same order
    odd = dist.new_group([r for r in range(ws) if r % 2 == 1])
    x = torch.ones(1000)
    step("AllReduce", "world", 1000, -1, lambda: dist.all_reduce(x))
    # a straggler: rank ws-1 enters 0.3 s late, so everyone's all_reduce lasts >= 0.3 s from its own entry
    # (ranks are synchronised by the previous all_reduce)
    if rank == ws - 1:
        time.sleep(0.3)
    step("AllReduce", "world", 1000, -1, lambda: dist.all_reduce(x))
    step("AllReduce", "world", 10, -1, lambda: dist.all_reduce(torch.ones(10), async_op=True).wait())
    step("Broadcast", "world", 7, 1, lambda: dist.broadcast(torch.ones(7), src=1))
    step("Reduce", "world", 5, 0, lambda: dist.reduce(torch.ones(5), dst=0))
    step("AllGather", "world", 3, -1, lambda: dist.all_gather([torch.zeros(3) for _ in range(ws)], torch.ones(3)))
    step("AllGather", "world", 4, -1,
         lambda: dist.all_gather_into_tensor(torch.zeros(4 * ws), torch.ones(4)))
    step("AllToAll", "world", 2 * ws, -1, lambda: dist.all_to_all_single(torch.zeros(2 * ws), torch.ones(2 * ws)))
    step("Gather", "world", 6, 0, lambda: dist.gather(torch.ones(6), [torch.zeros(6) for _ in range(ws)]
                                                     if rank == 0 else None, dst=0))
    step("Scatter", "world", 6, 0, lambda: dist.scatter(torch.zeros(6), [torch.ones(6) for _ in range(ws)]
                                                       if rank == 0 else None, src=0))
    step("AllReduce", "world", 9, -1, lambda: dist.all_reduce(torch.ones(9, dtype=torch.float64)), nbytes=72)
    if rank in (0, 1):
        step("AllReduce", "pair", 11, -1, lambda: dist.all_reduce(torch.ones(11), group=pair))
        # p2p inside the pair group, peers given as global ranks
        if rank == 0:
            step("Send", "world", 8, 1, lambda: dist.send(torch.ones(8), dst=1))
            buf = torch.zeros(8)
            # rank 1 sends 0.3 s late: the async receive cannot end before that
            step("Recv", "world", 8, 1, lambda: dist.irecv(buf, src=1).wait())
        else:
            step("Recv", "world", 8, 0, lambda: dist.recv(torch.zeros(8), src=0))
            time.sleep(0.3)
            step("Send", "world", 8, 0, lambda: dist.isend(torch.ones(8), dst=0).wait())
    if rank % 2 == 1:
        step("AllReduce", "odd", 12, -1, lambda: dist.all_reduce(torch.ones(12), group=odd))
    # a ring exchange with batch_isend_irecv: one Send and one Recv record
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    ops = [dist.P2POp(dist.isend, torch.ones(13), nxt), dist.P2POp(dist.irecv, torch.zeros(13), prv)]
    t0 = time.monotonic_ns()
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    t1 = time.monotonic_ns()
    log.append({"op": "Send", "group": "world", "count": 13, "bytes": 52, "peer": nxt, "t0": t0, "t1": t1,
                "in_group": True})
    log.append({"op": "Recv", "group": "world", "count": 13, "bytes": 52, "peer": prv, "t0": t0, "t1": t1,
                "in_group": True})
    step("Barrier", "world", 0, -1, lambda: dist.barrier(), nbytes=0)
    # an object collective is recorded as the tensor collectives it is made of, not twice
    objs: list[object] = [None] * ws
    dist.all_gather_object(objs, {"rank": rank})
    if objs != [{"rank": r} for r in range(ws)]:
        return 3
    dist.barrier()
    ring_file = th.ring_file()
    dist.destroy_process_group()
    th.uninstall(unlink=False)
    checks["restored"] = not getattr(dist.all_reduce, "_failslow_hook", False) and not th.installed()
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"installed": installed, "ring": ring_file, "log": log, "pid": os.getpid(), "checks": checks}, f)
    return 0


if __name__ == "__main__":
    code = main()
    # Everything the test reads is written and the process group destroyed: leave without the interpreter's
    # teardown, where torch's gloo threads can still be joinable and abort the process ("terminate called
    # without an active exception", exit -6, seen once with rank2.json already written).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
