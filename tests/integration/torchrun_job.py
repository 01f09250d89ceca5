"""A tiny elastic training job for the torchrun adapter's integration test, run by real ``torchrun`` agents.

What it does, per step: a small linear model on seeded random data, its gradients averaged over all ranks
with gloo ``all_reduce`` (so every rank needs every other rank each step, as data-parallel training does),
then one JSON line appended to the run's progress file. Rank 0 saves a checkpoint every few steps (and when
asked through the checkpoint-now file); every rank loads the newest checkpoint on start, so a worker
group restarted by TorchElastic continues where the checkpoint left it, not at step 0.

Files under ``--run-dir`` (the adapter's options in the test point at the same names):

* ``progress.jsonl`` — one line per rank per step: ``step`` (the step just completed, from 1), ``attempt``
  (rank 0's start time, broadcast: the same for all ranks of one start of the worker group, new at every
  restart, including TorchElastic's membership-change restarts, which do not bump the restart count),
  ``restart`` (``TORCHELASTIC_RESTART_COUNT`` of this rank's agent), ``world``, ``rank``, ``node`` (from
  ``FAILSLOW_NODE``) and ``time`` (Unix seconds);
* ``ckpt.pt`` — the checkpoint (step, model, optimiser), replaced atomically;
* ``checkpoint-now`` / ``checkpoint-now.ack`` — a request to checkpoint at the next step boundary and its
  acknowledgement (``{"id": <request id>, "step": <checkpointed step>}``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _append_line(path: Path, record: dict[str, object]) -> None:
    # One write() on an O_APPEND descriptor: lines from several ranks never interleave mid-line.
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _save(path: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    # Readers (a restarted worker) must never see a half-written checkpoint.
    os.replace(tmp, path)


def main() -> None:
    """Train until ``--steps`` steps are done, resuming from the run's checkpoint."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-time", type=float, default=0.2, help="seconds each step takes at least")
    ap.add_argument("--ckpt-every", type=int, default=10)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("FAILSLOW_NODE", "?")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run_dir: Path = args.run_dir
    ckpt, progress = run_dir / "ckpt.pt", run_dir / "progress.jsonl"
    request, ack = run_dir / "checkpoint-now", run_dir / "checkpoint-now.ack"

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Rank 0 decides what every rank resumes from, so that all ranks agree even if rank 0 writes a new
    # checkpoint while the others are still starting up.
    box: list[object] = [time.time(), 0]
    if rank == 0 and ckpt.exists():
        box[1] = torch.load(ckpt, weights_only=True)["step"]
    dist.broadcast_object_list(box, src=0)
    attempt, start = box[0], int(box[1])  # type: ignore[call-overload]
    if start > 0:
        state = torch.load(ckpt, weights_only=True)
        if state["step"] != start:
            raise RuntimeError(f"checkpoint moved on during start: {state['step']} != {start}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, args.steps + 1):
        t0 = time.monotonic()
        x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        _append_line(progress, {"step": step, "attempt": attempt, "restart": restart, "world": world,
                                "rank": rank, "node": node, "time": time.time()})
        if rank == 0:
            asked = request.exists()
            if asked or step % args.ckpt_every == 0:
                _save(ckpt, step, model, opt)
            if asked:
                req_id = request.read_text().strip()
                ack_tmp = ack.with_suffix(".tmp")
                ack_tmp.write_text(json.dumps({"id": req_id, "step": step}))
                os.replace(ack_tmp, ack)
                request.unlink(missing_ok=True)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - t0)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
