"""Exporter configuration: one `Settings`, read from ``FAILSLOW_EXPORTER_*`` variables in `main()`."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_ring_dir() -> Path:
    return Path(os.environ.get("FAILSLOW_SHM_DIR") or "/dev/shm")


class Settings(BaseSettings):
    """Everything the node agent can be told; built once in `main()` and passed down.

    Attributes:
        port: HTTP port of ``/metrics`` (0 picks a free one; the bound port is logged).
        address: Address to bind.
        ring_dir: Directory holding the ``failslow-*.ring`` files (default ``$FAILSLOW_SHM_DIR`` or /dev/shm).
        node: This node's name, the ``node`` label of GPU series and of ranks whose ring names no node.
        scan_interval_s: How often rings are discovered and read between scrapes (keeps rings from
            overflowing and hang detection fresh).
        window: Iterations averaged into ``failslow_iteration_duration_seconds``.
        buffer_calls: Calls kept per ring for period inference (largest period = buffer / 4).
        textfile_dir: Directory of ``*.prom`` files to serve (e.g. what-if results); none when unset.
        fake_gpus: Serve this many simulated GPUs instead of NVML (like dcgm-exporter's --fake-gpus).
        collectors: Names of the collectors to run (default all registered ones).
    """

    model_config = SettingsConfigDict(env_prefix="FAILSLOW_EXPORTER_", extra="ignore")

    port: int = Field(9400, ge=0, le=65535)
    address: str = "0.0.0.0"
    ring_dir: Path = Field(default_factory=_default_ring_dir)
    node: str = Field(default_factory=socket.gethostname)
    scan_interval_s: float = Field(1.0, gt=0)
    window: int = Field(20, ge=1)
    buffer_calls: int = Field(8192, ge=64)
    textfile_dir: Path | None = None
    fake_gpus: int = Field(0, ge=0, le=1024)
    collectors: tuple[str, ...] = ("ring", "nvml", "textfile")

    @field_validator("collectors", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return v
