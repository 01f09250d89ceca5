"""A small GPT-style transformer split into pipeline stages, with optional tensor parallelism.

Each pipeline stage holds a contiguous slice of the transformer blocks; stage 0 also holds the token
and position embeddings, the last stage the final LayerNorm, the LM head and the loss. With TP > 1
the attention and MLP use Megatron's column-/row-parallel linear layers: QKV and fc1 are split by
output (heads / hidden units), the attention projection and fc2 by input, and one all-reduce over the
TP group sums the partial outputs (the "g" operator); its backward counterpart ("f") all-reduces the
input gradient. Every rank builds the full-size weights from the same seed and keeps its shard, so
DP replicas and TP shards start consistent without a broadcast.

The training data is a deterministic synthetic corpus from a sparse random Markov chain over a
byte vocabulary: easy enough that the loss visibly falls within tens of iterations, and any
(step, micro-batch) can be regenerated on any rank without communication.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from testbed.config import ModelConfig, stage_layers

__all__ = ["AdamW", "Block", "Corpus", "ModelConfig", "Stage", "TPContext", "stage_layers"]


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group backward (Megatron's "f")."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce over the TP group forward; identity backward (Megatron's "g")."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        return g, None


class TPContext:
    """The TP group of this rank (None when TP = 1) and its position in it."""

    def __init__(self, group: dist.ProcessGroup | None, size: int, rank: int) -> None:
        self.group, self.size, self.rank = group, size, rank

    def copy_in(self, x: torch.Tensor) -> torch.Tensor:
        """Enter a column-parallel region."""
        return x if self.size == 1 else _CopyToTP.apply(x, self.group)

    def reduce_out(self, x: torch.Tensor) -> torch.Tensor:
        """Leave a row-parallel region."""
        return x if self.size == 1 else _ReduceFromTP.apply(x, self.group)


def _shard(weight: torch.Tensor, dim: int, tp: TPContext) -> nn.Parameter:
    return nn.Parameter(weight.chunk(tp.size, dim=dim)[tp.rank].clone())


class Block(nn.Module):
    """Pre-LN transformer block with TP-sharded attention heads and MLP hidden units."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        d, h = cfg.d_model, cfg.heads
        self.tp, self.local_heads, self.head_dim = tp, h // tp.size, d // h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        std = 0.02
        qkv = torch.randn(3, d, d, generator=gen) * std          # (q|k|v, out, in)
        proj = torch.randn(d, d, generator=gen) * std / math.sqrt(2 * cfg.layers)
        fc1 = torch.randn(cfg.ffn_mult * d, d, generator=gen) * std
        fc2 = torch.randn(d, cfg.ffn_mult * d, generator=gen) * std / math.sqrt(2 * cfg.layers)
        # column-parallel: split outputs (heads, hidden units); row-parallel: split inputs.
        self.qkv_w = nn.Parameter(torch.cat([qkv[i].chunk(tp.size, 0)[tp.rank] for i in range(3)], 0).clone())
        self.qkv_b = nn.Parameter(torch.zeros(3 * d // tp.size))
        self.proj_w = _shard(proj, 1, tp)
        self.proj_b = nn.Parameter(torch.zeros(d))
        self.fc1_w = _shard(fc1, 0, tp)
        self.fc1_b = nn.Parameter(torch.zeros(cfg.ffn_mult * d // tp.size))
        self.fc2_w = _shard(fc2, 1, tp)
        self.fc2_b = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        y = self.tp.copy_in(self.ln1(x))
        qkv = F.linear(y, self.qkv_w, self.qkv_b).view(b, t, 3, self.local_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, self.local_heads * self.head_dim)
        x = x + self.tp.reduce_out(F.linear(a, self.proj_w)) + self.proj_b
        y = self.tp.copy_in(self.ln2(x))
        y = F.gelu(F.linear(y, self.fc1_w, self.fc1_b))
        return x + self.tp.reduce_out(F.linear(y, self.fc2_w)) + self.fc2_b


class Stage(nn.Module):
    """The part of the model one pipeline stage runs."""

    def __init__(self, cfg: ModelConfig, pp_rank: int, pp_size: int, tp: TPContext, seed: int) -> None:
        super().__init__()
        self.cfg, self.first, self.last = cfg, pp_rank == 0, pp_rank == pp_size - 1
        self.block_ids = stage_layers(cfg.layers, pp_size)[pp_rank]
        self.blocks = nn.ModuleList(Block(cfg, tp, seed * 10_007 + i) for i in self.block_ids)
        gen = torch.Generator().manual_seed(seed * 10_007 + 99_991)
        if self.first:
            self.tok = nn.Parameter(torch.randn(cfg.vocab, cfg.d_model, generator=gen) * 0.02)
            self.pos = nn.Parameter(torch.randn(cfg.max_positions, cfg.d_model, generator=gen) * 0.01)
        if self.last:
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Parameter(torch.randn(cfg.vocab, cfg.d_model, generator=gen) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (stage 0) or hidden states in; hidden states or logits (last stage) out."""
        if self.first:
            x = self.tok[x] + self.pos[: x.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        if self.last:
            x = F.linear(self.ln_f(x), self.head)
        return x


class Corpus:
    """Deterministic synthetic token stream: a sparse random Markov chain (few likely successors)."""

    def __init__(self, vocab: int, seed: int, length: int = 100_000, fanout: int = 3) -> None:
        rng = np.random.default_rng(seed)
        succ = rng.integers(0, vocab, size=(vocab, fanout))
        probs = rng.dirichlet(np.ones(fanout) * 0.5, size=vocab)
        # the chain walk is inherently sequential: plain ints (numpy scalars are ~20x slower here)
        cum = probs.cumsum(axis=1).tolist()
        succ_l = succ.tolist()
        u = rng.random(length).tolist()
        out = [0] * length
        prev = 0
        for i in range(1, length):
            row = cum[prev]
            k = 0
            while k < fanout - 1 and u[i] > row[k]:
                k += 1
            prev = succ_l[prev][k]
            out[i] = prev
        toks = np.asarray(out, dtype=np.int64)
        self.tokens = torch.from_numpy(toks)
        self.seed = seed

    def batch(self, step: int, global_mb: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of micro-batch `global_mb` of `step`: `batch` windows of `seq` tokens."""
        rng = np.random.default_rng([self.seed, step, global_mb])
        starts = rng.integers(0, len(self.tokens) - seq - 1, size=batch)
        idx = torch.from_numpy(starts)[:, None] + torch.arange(seq + 1)[None, :]
        w = self.tokens[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


class AdamW:
    """AdamW (decoupled weight decay, bias-corrected moments), the same update as torch.optim.AdamW.

    Written out because constructing torch.optim.AdamW imports torch._dynamo (~4 s of start-up per
    rank on this machine, times every rank sharing two cores).
    """

    def __init__(self, params: list[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.params, self.lr, self.betas, self.eps, self.wd = list(params), lr, betas, eps, weight_decay
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        """Zero the gradients in place (accumulation over micro-batches starts from zero)."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter with its current gradient."""
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            p.mul_(1 - self.lr * self.wd)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / bc2).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / bc1)

    def state_dict(self) -> dict[str, Any]:
        """Moments and step count (for checkpoints)."""
        return {"t": self.t, "m": [x.clone() for x in self.m], "v": [x.clone() for x in self.v],
                "lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.wd}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.t = int(d["t"])
        for dst, src in zip(self.m + self.v, d["m"] + d["v"], strict=True):
            dst.copy_(src)
