"""Which jobs a detector replica owns: Prometheus' ``hashmod`` of the job label, modulo the replica count.

Prometheus shards scrape targets the same way (relabel action ``hashmod``, ``model/relabel/relabel.go``):
the MD5 digest of the label value, its last 8 bytes read as a big-endian unsigned 64-bit integer, modulo
N. Using the same function means a Prometheus ``hashmod`` relabel rule on ``job`` computes the very
shard a job belongs to (the sharding integration test checks it against a real Prometheus).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass


@functools.lru_cache(maxsize=1 << 16)  # asked for every series of every poll; job names repeat
def hashmod(value: str, modulus: int) -> int:
    """Prometheus' relabel ``hashmod`` of one label value (UTF-8 bytes, as Go's ``[]byte(val)``).

    Raises:
        ValueError: ``modulus`` below 1.
    """
    if modulus < 1:
        raise ValueError(f"hashmod modulus must be at least 1, got {modulus}")
    return int.from_bytes(hashlib.md5(value.encode("utf-8")).digest()[8:], "big") % modulus


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def job_regex(jobs: list[str]) -> str:
    """A PromQL double-quoted string literal (quotes included) whose RE2 regex matches exactly ``jobs``.

    Regex metacharacters are escaped for RE2, then backslashes and quotes for the PromQL string;
    Prometheus anchors label regexes, and turns an alternation of literals into a set lookup.
    """
    rx = "|".join(_RE2_SPECIAL.sub(r"\\\1", j) for j in sorted(jobs))
    lit = rx.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + lit + '"'


@dataclass(frozen=True)
class Shard:
    """One replica's share of the jobs: those whose ``hashmod(job, count)`` is ``index``.

    Attributes:
        index: This replica's number, 0 <= index < count.
        count: Replicas the jobs are split over (1: one detector watches every job).
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"shard count must be at least 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index {self.index} is not in 0..{self.count - 1} (shards = {self.count})")

    @property
    def sharded(self) -> bool:
        """Whether the jobs are split over several replicas."""
        return self.count > 1

    def owns(self, job: str) -> bool:
        """Whether this replica watches ``job``."""
        return self.count == 1 or hashmod(job, self.count) == self.index
