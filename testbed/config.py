"""Model and job sizes of the testbed, importable without torch (the launcher does not load torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Model and data sizes. Defaults: DP2×PP2 runs a few iterations/s on 2 CPU cores."""

    vocab: int = 256
    d_model: int = 192
    heads: int = 4
    layers: int = 4
    seq_len: int = 64
    micro_batch_size: int = 4
    ffn_mult: int = 4
    max_seq_factor: float = 4.0

    @property
    def max_positions(self) -> int:
        """Position table size: room for the longest sequence a seqlen fault may ask for."""
        return math.ceil(self.seq_len * self.max_seq_factor)


def stage_layers(layers: int, pp: int) -> list[range]:
    """Which global block indices each of `pp` stages holds (earlier stages get the remainder)."""
    base, extra = divmod(layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out
