"""One rank of a testbed job: real hybrid-parallel training with torch.distributed (gloo) on CPU.

Run by the launcher as ``python -m testbed.worker RUN_DIR RANK`` (inside the node's network
namespace when there is one). The job description is ``RUN_DIR/config.json``; the rank writes

* ``progress/rank<r>.jsonl`` — one line per finished iteration (times, loss, micro-batches), read
  live by the launcher for the progress display, iteration-based fault schedules and the report;
* ``trace/rank<r>.json`` — per-operation timings (forward/backward compute per micro-batch, the
  p2p of each micro-batch, the DP gradient all-reduce, optimizer, GC pauses, and the per-iteration
  CPU work outside them as ``step-overhead``) on the shared CLOCK_MONOTONIC, merged by the launcher
  into the what-if trace schema.

Schedule: Megatron's non-interleaved 1F1B (warm-up forwards, steady one-forward-one-backward with the
combined send-forward/recv-backward p2p, cool-down backwards), gradient accumulation over the
micro-batches, one flat all-reduce of the gradients over the DP group, AdamW.

Run-time control (micro-batch counts per DP replica, in-trainer faults, checkpoints, validations, stop) comes from
``RUN_DIR/control.json``, which every rank reads at each iteration start. Each snapshot carries the
iteration it applies from (set by the launcher a few iterations ahead of the slowest rank), so all
ranks switch at the same iteration without an extra collective inside the measured iteration.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from failslow.topology import Layout
from testbed.model import AdamW, Corpus, ModelConfig, Stage, TPContext, stage_layers
from testbed.validation import run_in_rank

# optype names follow the Megatron trace in ../shared/data/whatif-ST so what-if analysis reads ours.
FWD, BWD = "forward-compute", "backward-compute"
FSEND, FRECV, BSEND, BRECV = "forward-send", "forward-recv", "backward-send", "backward-recv"
GRADS, OPTIM, GC = "grads-all-reduce", "optimizer", "gc"
# ours, not Megatron's: the rank's per-iteration CPU work outside the ops above (see Rank.iteration)
OVERHEAD = "step-overhead"


class Control:
    """Reads the control file; returns the snapshot in force at a given iteration."""

    def __init__(self, path: Path) -> None:
        self.path, self._mtime, self._snaps = path, -1, [{"apply_at": 0}]

    def at(self, iteration: int) -> dict[str, Any]:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime != self._mtime:
                self._snaps = json.loads(self.path.read_text())["snapshots"]
                self._mtime = mtime
        except (OSError, ValueError, KeyError):
            pass  # the launcher replaces the file atomically; a failed read retries next iteration
        current: dict[str, Any] = {}
        for snap in self._snaps:
            if snap["apply_at"] <= iteration:
                current = snap
        return current


class Trace:
    """Per-operation timing rows of this rank (monotonic seconds)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k in
                                           ("step", "optype", "t0", "t1", "seq_id", "mc", "gmc", "mb_id")}

    def add(self, step: int, optype: str, t0: float, t1: float, seq_id: int = 0, mc: int = -1,
            gmc: int = -1, mb_id: int = -1) -> None:
        for k, v in (("step", step), ("optype", optype), ("t0", t0), ("t1", t1), ("seq_id", seq_id),
                     ("mc", mc), ("gmc", gmc), ("mb_id", mb_id)):
            self.cols[k].append(v)


def _burn(seconds: float) -> None:
    """Busy CPU work for `seconds` (stage-imbalance fault): real compute, not a sleep."""
    end = time.monotonic() + seconds
    a = torch.randn(48, 48)
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


class Rank:
    """State and loop of one rank."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.cfg: dict[str, Any] = json.loads((run_dir / "config.json").read_text())
        lay = self.cfg["layout"]
        self.layout = Layout(tp=lay["tp"], pp=lay["pp"], dp=lay["dp"], ranks_per_node=lay.get("ranks_per_node"))
        self.c = self.layout.coords(rank)
        self.mcfg = ModelConfig(**self.cfg["model"])
        self.trace = Trace()
        self.iter_start = 0.0  # monotonic end of this rank's previous iteration
        self.control = Control(run_dir / "control.json")
        self.progress = open(run_dir / "progress" / f"rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    # --- set-up -------------------------------------------------------------------------------

    def _say(self, what: str) -> None:
        # phase timestamps in the rank's log: where start-up and shutdown time goes
        print(f"[rank {self.rank} {time.time():.3f}] {what}", flush=True)

    def setup(self) -> None:
        self._say("imported")
        if self.cfg.get("pin_cpus"):
            # Before gloo and torch start their threads, which inherit it. Why: CFS bandwidth control
            # charges a capped task's runtime per CPU and checks it at the scheduler tick, so a task
            # that migrates leaves its overrun behind and gets more than its cap by a varying amount.
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[self.rank % len(cpus)]})
        torch.set_num_threads(1)
        with contextlib.suppress(RuntimeError):  # only possible before any inter-op work
            torch.set_num_interop_threads(1)
        torch.manual_seed(self.cfg["seed"])
        if self.cfg.get("torch_hook"):
            from failslow.record import torchhook  # imported only when asked

            torchhook.install(job=self.cfg["job"], rank=self.rank, layout=self.layout)
        elif os.environ.get("FAILSLOW_TORCH_HOOK"):
            from failslow.record import torchhook

            torchhook.install_from_env()
        dist.init_process_group("gloo", rank=self.rank, world_size=self.layout.world_size,
                                timeout=timedelta(seconds=self.cfg.get("timeout_s", 300)))
        self._say("process group up")
        # every rank creates every group, in the same order (a torch.distributed requirement)
        self.dp_group = self.tp_group = None
        for kind in ("dp", "tp"):
            for g in self.layout.groups(kind):
                pg = dist.new_group(list(g)) if len(g) > 1 else None
                if self.rank in g:
                    setattr(self, f"{kind}_group", pg)
        self._say("groups created")
        tp = TPContext(self.tp_group, self.layout.tp, self.c.tp)
        self.model = Stage(self.mcfg, self.c.pp, self.layout.pp, tp, self.cfg["seed"])
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        opt = self.cfg["optimizer"]
        self.opt = AdamW(self.params, lr=opt["lr"], betas=(0.9, 0.95), weight_decay=opt["weight_decay"])
        self.start_iter = 0
        if self.cfg.get("resume_dir"):
            ck = torch.load(Path(self.cfg["resume_dir"]) / f"pp{self.c.pp}-tp{self.c.tp}.pt", weights_only=False)
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
            self.start_iter = int(ck["iteration"])
        self.corpus = Corpus(self.mcfg.vocab, self.cfg["seed"]) if (self.model.first or self.model.last) else None
        self.prev_rank = self.layout.rank_of(type(self.c)(tp=self.c.tp, cp=0, dp=self.c.dp, pp=self.c.pp - 1)) \
            if not self.model.first else -1
        self.next_rank = self.layout.rank_of(type(self.c)(tp=self.c.tp, cp=0, dp=self.c.dp, pp=self.c.pp + 1)) \
            if not self.model.last else -1
        self._say("model built")
        self.n_local_layers = len(stage_layers(self.mcfg.layers, self.layout.pp)[self.c.pp])

    # --- p2p ----------------------------------------------------------------------------------

    def _p2p(self, step: int, seq: int, sends: list[tuple[str, torch.Tensor | None, int]],
             recvs: list[tuple[str, torch.Tensor, int]]) -> None:
        ops = []
        for name, t, peer in sends:
            if t is None:
                raise RuntimeError(f"{name}: nothing to send (no input gradient)")
            ops.append(dist.P2POp(dist.isend, t, peer))
        ops += [dist.P2POp(dist.irecv, t, peer) for _, t, peer in recvs]
        if not ops:
            return
        t0 = time.monotonic()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        t1 = time.monotonic()
        # a combined op is one transfer window; like Megatron's trace, record it under each op type,
        # each with its own per-iteration sequence number (= the micro-batch it carries)
        for name, _, _ in sends + recvs:
            n = self._p2p_seq.get(name, 0)
            self._p2p_seq[name] = n + 1
            self.trace.add(step, name, t0, t1, seq_id=n)

    def _pace(self, t0: float, c0: float) -> None:
        """Stretch a compute op that started at `t0` (monotonic; thread CPU time `c0`) to its CPU time /
        the device speed: the emulated device of ``--device-speed``.

        Why: ranks sharing the host's cores are not devices of their own - a rank runs faster while
        its peers wait on a straggler. An op that takes CPU time / speed of wall time, however busy
        the cores are (contention only stretches the part that runs, which stays shorter as long as
        the ranks' speeds sum below the cores), runs at its device's pace whatever its peers do. A
        CPU fault's quota below the speed then makes the op longer than that (no sleep is added).
        """
        speed = self.cfg.get("device_speed")
        if speed:
            wait = t0 + (time.thread_time() - c0) / speed - time.monotonic()
            if wait > 0:
                time.sleep(wait)

    # --- one iteration ------------------------------------------------------------------------

    def iteration(self, it: int, snap: dict[str, Any]) -> float | None:
        cfg, lay, c = self.mcfg, self.layout, self.c
        mbs = snap.get("microbatches") or [self.cfg["micro_batches"]] * lay.dp
        m, offset, total = mbs[c.dp], sum(mbs[: c.dp]), sum(mbs)
        faults = list((snap.get("faults") or {}).values())
        seq_factor = 1.0
        stage_factor = 1.0
        gc_fault = None
        for f in faults:
            if f["kind"] == "seqlen" and f["dp"] == c.dp:
                seq_factor *= f["factor"]
            elif f["kind"] == "stage" and f["pp"] == c.pp:
                stage_factor *= f["factor"] if f.get("factor") else \
                    (self.n_local_layers + f["layers"]) / self.n_local_layers
            elif f["kind"] == "gc" and f["rank"] == self.rank:
                gc_fault = f
        seq = max(2, round(cfg.seq_len * seq_factor))
        shape = (cfg.micro_batch_size, seq, cfg.d_model)
        P, s = lay.pp, c.pp
        warm = min(P - s - 1, m)
        inflight: deque[tuple[int, torch.Tensor | None, torch.Tensor]] = deque()
        losses: list[float] = []
        fwd_i = bwd_i = 0
        gmc = s  # the chunk's position in the whole model, mc * pp + stage (one chunk per stage, mc = 0)

        def data(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if self.corpus is None:
                raise RuntimeError("only the first and last stages read data")
            step = 0 if self.cfg.get("repeat_data") else it
            return self.corpus.batch(step, offset + i, cfg.micro_batch_size, seq)

        def recv_buf() -> torch.Tensor:
            return torch.empty(shape)

        def forward(x: torch.Tensor | None) -> torch.Tensor:
            nonlocal fwd_i
            i = fwd_i
            fwd_i += 1
            t0, c0 = time.monotonic(), time.thread_time()
            inp = data(i)[0] if self.model.first else x
            y = self.model(inp)
            if self.model.last:
                tgt = data(i)[1]
                loss = F.cross_entropy(y.reshape(-1, cfg.vocab), tgt.reshape(-1))
                losses.append(float(loss.detach()))
                y = loss / total  # the global-batch mean: same gradient however micro-batches are spread
            if stage_factor > 1.0:
                _burn((stage_factor - 1.0) * (time.monotonic() - t0))
            self._pace(t0, c0)
            self.trace.add(it, FWD, t0, time.monotonic(), seq_id=i, mc=0, gmc=gmc, mb_id=i)
            inflight.append((i, x, y))
            return y

        def backward(g: torch.Tensor | None) -> torch.Tensor | None:
            nonlocal bwd_i
            i, x, y = inflight.popleft()
            bwd_i += 1
            t0, c0 = time.monotonic(), time.thread_time()
            if self.model.last:
                y.backward()
            else:
                torch.autograd.backward(y, grad_tensors=g)
            if stage_factor > 1.0:
                _burn((stage_factor - 1.0) * (time.monotonic() - t0))
            self._pace(t0, c0)
            self.trace.add(it, BWD, t0, time.monotonic(), seq_id=i, mc=0, gmc=gmc, mb_id=i)
            return None if x is None else x.grad

        def recv_forward(i: int) -> torch.Tensor | None:
            if self.model.first:
                return None
            buf = recv_buf()
            self._p2p(it, i, [], [(FRECV, buf, self.prev_rank)])
            return buf.requires_grad_()

        def send_forward(y: torch.Tensor, i: int) -> None:
            if not self.model.last:
                self._p2p(it, i, [(FSEND, y.detach(), self.next_rank)], [])

        def send_forward_recv_backward(y: torch.Tensor, i: int) -> torch.Tensor | None:
            if self.model.last:
                return None
            g = recv_buf()
            self._p2p(it, i, [(FSEND, y.detach(), self.next_rank)], [(BRECV, g, self.next_rank)])
            return g

        def send_backward_recv_forward(dx: torch.Tensor | None, i: int) -> torch.Tensor | None:
            if self.model.first:
                return None
            x = recv_buf()
            self._p2p(it, i, [(BSEND, dx, self.prev_rank)], [(FRECV, x, self.prev_rank)])
            return x.requires_grad_()

        def recv_backward(i: int) -> torch.Tensor | None:
            if self.model.last:
                return None
            g = recv_buf()
            self._p2p(it, i, [], [(BRECV, g, self.next_rank)])
            return g

        def send_backward(dx: torch.Tensor | None, i: int) -> None:
            if not self.model.first:
                self._p2p(it, i, [(BSEND, dx, self.prev_rank)], [])

        self.opt.zero_grad()
        self._p2p_seq: dict[str, int] = {}
        # The CPU work of this rank since its previous iteration ended (that iteration's progress
        # record, the control file, zero_grad) as an op of its own: it is on the critical path and a
        # CPU fault slows it like compute. It starts where the previous iteration ended, so the
        # trace places consecutive steps exactly (what-if --continuous).
        self.trace.add(it, OVERHEAD, self.iter_start, time.monotonic())
        for i in range(warm):
            y = forward(recv_forward(i))
            send_forward(y, i)
        remaining = m - warm
        x = recv_forward(warm) if remaining > 0 else None
        for k in range(remaining):
            y = forward(x)
            g = send_forward_recv_backward(y, warm + k)
            dx = backward(g)
            if k == remaining - 1:
                x = None
                send_backward(dx, k)
            else:
                x = send_backward_recv_forward(dx, warm + k + 1)
        for k in range(warm):
            g = recv_backward(remaining + k)
            dx = backward(g)
            send_backward(dx, remaining + k)

        if gc_fault is not None and (it + 1) % gc_fault["every"] == 0:
            t0 = time.monotonic()
            gc.collect()
            time.sleep(gc_fault["pause"])
            self.trace.add(it, GC, t0, time.monotonic())

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.dp_group is not None:
            t0 = time.monotonic()
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            pos = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[pos:pos + n].view_as(g))
                pos += n
            self.trace.add(it, GRADS, t0, time.monotonic(), mc=0)
        if it in self.cfg.get("dump_grads_iters", []):
            d = self.run_dir / "grads"
            d.mkdir(exist_ok=True)
            torch.save(torch.cat([g.reshape(-1) for g in grads]), d / f"rank{self.rank}-it{it}.pt")
        t0, c0 = time.monotonic(), time.thread_time()
        self.opt.step()
        self._pace(t0, c0)
        self.trace.add(it, OPTIM, t0, time.monotonic())
        self.last_shape = {"seq_len": seq, "stage_factor": stage_factor}
        return sum(losses) / len(losses) if losses else None

    # --- checkpoint ---------------------------------------------------------------------------

    def save(self, directory: Path, next_iter: int) -> None:
        if self.c.dp != 0:
            return
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"pp{self.c.pp}-tp{self.c.tp}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                    "iteration": next_iter, "layout": self.cfg["layout"], "model_config": self.cfg["model"]}, tmp)
        os.replace(tmp, path)

    # --- main loop ----------------------------------------------------------------------------

    def run(self) -> None:
        self.setup()
        dist.barrier()
        param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.progress.write(json.dumps({"rank": self.rank, "ready": True, "t": time.monotonic(),
                                        "param_bytes": param_bytes}) + "\n")
        mono_to_unix = time.time() - time.monotonic()
        prev = time.monotonic()
        end_iter = self.cfg["iterations"]
        for it in range(self.start_iter, end_iter):
            snap = self.control.at(it)
            stop_at = snap.get("stop_at")
            if stop_at is not None and it >= stop_at:
                break
            start = prev
            self.iter_start = start
            # FALCON's validation at this boundary (testbed.validation): every rank takes part. Its time
            # is part of this iteration (the pause it costs) and of the trace's step-overhead.
            val = snap.get("validate")
            held = run_in_rank(self.rank, val) if val and val.get("at") == it else None
            loss = self.iteration(it, snap)
            end = time.monotonic()
            mbs = snap.get("microbatches") or [self.cfg["micro_batches"]] * self.layout.dp
            rec: dict[str, Any] = {"rank": self.rank, "it": it, "start": start, "end": end,
                                   "end_unix": end + mono_to_unix, "dt": end - start, "loss": loss,
                                   "mb": mbs[self.c.dp], **self.last_shape, "faults": sorted((snap.get("faults") or {}).keys())}
            if held is not None:
                rec["validate"], rec["validate_s"] = val["id"], held
            ck = snap.get("checkpoint")
            if ck and ck["after_iter"] == it:
                self.save(Path(ck["dir"]), it + 1)
                rec["checkpoint"] = ck["dir"]
            self.progress.write(json.dumps(rec) + "\n")
            prev = end
        out = self.run_dir / "trace" / f"seg{self.cfg.get('segment', 0)}-rank{self.rank}.json"
        out.write_text(json.dumps({"rank": self.rank, "mono_to_unix": mono_to_unix, **self.trace.cols}))
        self.progress.write(json.dumps({"rank": self.rank, "done": True}) + "\n")
        self.progress.close()
        self._say("trace written")
        dist.barrier()
        dist.destroy_process_group()
        self._say("process group destroyed")


def main(argv: list[str]) -> int:
    """Entry point: ``python -m testbed.worker RUN_DIR RANK``."""
    run_dir, rank = Path(argv[0]), int(argv[1])
    Rank(run_dir, rank).run()
    if "failslow.record.torchhook" in sys.modules:
        # os._exit skips the hook's atexit handler: close the ring the way it would
        from failslow.record import torchhook

        keep = os.environ.get("FAILSLOW_KEEP_RINGS", "").strip() not in ("", "0")
        torchhook.uninstall(unlink=not keep)
    sys.stdout.flush()
    # skip interpreter teardown: with gloo's threads it takes seconds and everything is written
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
