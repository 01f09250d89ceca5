"""A healthy GPU training run with a batch-size ramp-up, logged per iteration as Megatron-LM logs it.

Run on a machine with an NVIDIA GPU and PyTorch built for CUDA:

    python3 scripts/gpu_ramp_run.py --out /tmp/ramp [--shim shim/build/libfailslow_shim.so]

A GPT-style decoder (12 layers, d_model 1024, 16 heads, 32k vocabulary, bf16, fused AdamW) trains on
synthetic token streams with Megatron's batch-size ramp-up semantics (``--rampup-batch-size START INCR
SAMPLES``: the global batch is START + INCR * floor(consumed_samples / (SAMPLES / number of increments)),
capped at the final global batch), gradient accumulation over micro-batches, an evaluation every
``--eval-interval`` iterations and a checkpoint save (``torch.save`` of model and optimizer) at
``--save-at``. Like Megatron's ``interval-time`` timer, the logged "elapsed time per iteration" leaves out
evaluation and checkpoint saving; ``start_to_start_s`` in the output keeps them in.

With ``--shim`` the run re-executes itself under LD_PRELOAD with NCCL (world size 1): each iteration
all-reduces the gradients in buckets and the loss, so the shim records its call stream (kept as
``shim_dump.jsonl.gz`` with ``--dump``).

Output: ``run.log`` (the Megatron-style lines) and ``ramp_run.json`` (steps, per-iteration seconds, global
batch sizes, losses, start-to-start seconds, what ran where).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def global_batch(consumed: int, start: int, incr: int, ramp_samples: int, final: int) -> int:
    """Megatron-LM's ramp-up rule: the global batch size after ``consumed`` samples."""
    n_incr = (final - start) // incr
    per_incr = ramp_samples / n_incr
    return min(final, start + incr * int(consumed / per_incr))


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    cuda = torch.cuda.is_available()  # without a GPU (a smoke test of this script): gloo on the CPU, fp32
    dev = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, **({"device_id": dev} if cuda else {}))
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(1234)
    d, L, heads, vocab, seq, mbs = args.d_model, args.layers, args.heads, args.vocab, args.seq, args.micro_batch

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Embedding(seq, d)
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True,
                                                 activation="gelu") for _ in range(L))
            self.norm = torch.nn.LayerNorm(d)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)
            self.register_buffer("mask", mask, persistent=False)
            torch.nn.init.normal_(self.emb.weight, std=0.02)  # GPT-2's initialisation of the tied embedding
            torch.nn.init.normal_(self.pos.weight, std=0.02)

        def forward(self, tok: torch.Tensor) -> torch.Tensor:
            h = self.emb(tok) + self.pos.weight[: tok.shape[1]]
            for b in self.blocks:
                h = b(h, src_mask=self.mask.to(h.dtype), is_causal=True)
            return self.norm(h) @ self.emb.weight.t()

    model = GPT().to(dev, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    n_params = sum(p.numel() for p in params)
    # gradient buckets of about 25M elements, as DDP's default 25 MB buckets group fp32 gradients
    buckets: list[list[torch.nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        if size + p.numel() > 25_000_000 and buckets[-1]:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    # synthetic corpus: token streams from a fixed order-1 Markov chain, so the loss can fall
    g = torch.Generator(device="cpu").manual_seed(7)
    trans = torch.randint(0, vocab, (vocab, 8), generator=g)

    def batch(n: int) -> torch.Tensor:
        first = torch.randint(0, vocab, (n,), generator=g)
        out = torch.empty(n, seq + 1, dtype=torch.long)
        out[:, 0] = first
        choice = torch.randint(0, 8, (n, seq), generator=g)
        for t in range(seq):
            out[:, t + 1] = trans[out[:, t], choice[:, t]]
        return out.to(dev, non_blocking=True)

    pool = [batch(mbs) for _ in range(64)]  # the "data loader": prepared batches, reused in turn

    def lm_loss(tok: torch.Tensor) -> torch.Tensor:
        logits = model(tok[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, vocab), tok[:, 1:].reshape(-1))

    out = Path(args.out)
    (out / "run.log").write_text("")

    def log(line: str) -> None:
        with open(out / "run.log", "a") as f:
            f.write(line)

    rec: dict[str, list[Any]] = {"steps": [], "seconds": [], "global_batch": [], "loss": [],
                                 "start_to_start_s": [], "eval_s": [], "save_s": []}
    consumed, it, k = 0, 0, 0
    t_begin = time.monotonic()
    last_start: float | None = None
    final_its = None
    while True:
        gb = global_batch(consumed, args.ramp[0], args.ramp[1], args.ramp[2], args.global_batch)
        if final_its is None and gb == args.global_batch:
            final_its = it + args.steady_iters
        if (final_its is not None and it >= final_its) or time.monotonic() - t_begin > args.max_seconds:
            break
        it += 1
        sync()
        t0 = time.monotonic()
        if last_start is not None:
            rec["start_to_start_s"].append(t0 - last_start)
        last_start = t0
        lr = args.lr * min(1.0, it / args.warmup_iters)
        for group in opt.param_groups:
            group["lr"] = lr
        n_mb = gb // mbs
        tot = torch.zeros((), device=dev)
        for _ in range(n_mb):
            loss = lm_loss(pool[k % len(pool)]) / n_mb
            k += 1
            loss.backward()
            tot += loss.detach()
        for b in buckets:  # the data-parallel gradient all-reduce, bucket by bucket
            flat = torch.cat([p.grad.reshape(-1) for p in b if p.grad is not None])
            dist.all_reduce(flat)
        lt = tot.reshape(1)
        dist.all_reduce(lt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lval = float(lt.item())
        dt = time.monotonic() - t0
        consumed += gb
        rec["steps"].append(it)
        rec["seconds"].append(round(dt, 6))
        rec["global_batch"].append(gb)
        rec["loss"].append(round(lval, 4))
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        log(f" [{now}] iteration {it:8d} | consumed samples: {consumed:12d} | elapsed time per iteration "
                  f"(ms): {dt * 1000:.1f} | learning rate: {lr:.6E} | global batch size: {gb:5d} | lm loss: "
                  f"{lval:.6E} | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:"
                  f"   0 |\n")
        if it % args.eval_interval == 0:
            te = time.monotonic()
            with torch.no_grad():
                ev = sum(float(lm_loss(pool[(k + j) % len(pool)])) for j in range(args.eval_iters))
            sync()
            rec["eval_s"].append([it, round(time.monotonic() - te, 3)])
            log(f" validation loss at iteration {it} | lm loss value: {ev / args.eval_iters:.6E} |\n")
        if it == args.save_at:
            ts = time.monotonic()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": it},
                       out / "ckpt.pt")
            os.sync()
            rec["save_s"].append([it, round(time.monotonic() - ts, 3)])
            log(f"  successfully saved checkpoint at iteration {it:7d} to {out / 'ckpt.pt'}\n")
            (out / "ckpt.pt").unlink()
    dist.destroy_process_group()
    doc = {"what": f"GPT-style decoder, {n_params / 1e6:.0f}M parameters ({L} layers, d_model {d}, {heads} heads, "
                   f"vocabulary {vocab}), sequence {seq}, micro-batch {mbs}, {str(dtype).removeprefix('torch.')}, AdamW, one "
                   f"{torch.cuda.get_device_name(0) if cuda else 'CPU'}; batch-size ramp-up {args.ramp[0]} {args.ramp[1]} "
                   f"{args.ramp[2]} to {args.global_batch}; evaluation every {args.eval_interval} iterations "
                   f"({args.eval_iters} micro-batches), checkpoint save at iteration {args.save_at}",
           "torch": torch.__version__, "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()) if cuda else None,
           "gradient_buckets": len(buckets), "wall_s": round(time.monotonic() - t_begin, 1), **rec}
    (out / "ramp_run.json").write_text(json.dumps(doc))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shim", default="", help="LD_PRELOAD this shim (the run re-executes itself under it)")
    ap.add_argument("--dump", action="store_true", help="with --shim: keep the ring as shim_dump.jsonl.gz")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--ramp", type=int, nargs=3, default=(32, 32, 24000), metavar=("START", "INCR", "SAMPLES"))
    ap.add_argument("--steady-iters", type=int, default=80, help="iterations after the ramp ends")
    ap.add_argument("--warmup-iters", type=int, default=50, help="learning-rate warm-up")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval-interval", type=int, default=100)
    ap.add_argument("--eval-iters", type=int, default=16)
    ap.add_argument("--save-at", type=int, default=200)
    ap.add_argument("--max-seconds", type=float, default=170.0, help="stop training after this long")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.shim and not args.child:
        rings = out / "rings"
        rings.mkdir(exist_ok=True)
        env = dict(os.environ, LD_PRELOAD=str(Path(args.shim).resolve()), FAILSLOW_SHM_DIR=str(rings),
                   FAILSLOW_KEEP_RINGS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
        rc = subprocess.call([sys.executable, *sys.argv, "--child"], env=env)
        if args.dump:
            import gzip

            d = subprocess.run([sys.executable, "-m", "failslow_cli", "shim-dump", "--dir", str(rings)],
                               capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"))
            with gzip.open(out / "shim_dump.jsonl.gz", "wt") as f:
                f.write(d.stdout)
        for r in rings.glob("*.ring"):
            r.unlink()
        rings.rmdir()
        sys.exit(rc)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    train(args)


if __name__ == "__main__":
    main()
