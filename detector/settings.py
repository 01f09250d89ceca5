"""Detector configuration: one `Settings`, read from ``FAILSLOW_DETECTOR_*`` variables in `main()`."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the detector service can be told; built once in `main()` and passed down.

    Attributes:
        prometheus_url: Base URL of the Prometheus HTTP API.
        redis_url: Redis holding open events and the detector snapshot.
        redis_prefix: Prefix of every Redis key the detector owns.
        port: HTTP port of the detector's own ``/metrics`` (0 picks a free one; the bound port is logged).
        address: Address to bind.
        poll_interval_s: Seconds between polls of Prometheus (one sample per rank per poll).
        query_timeout_s: Timeout of one Prometheus or Redis request.
        metric: The per-rank iteration-time series to watch.
        samples_metric: A per-job gauge of samples per iteration (global batch size); a job that publishes
            it is watched in seconds per sample, so a batch-size ramp-up is not a slowdown
            (`failslow.detect.work`). Empty: never.
        method: Detection method (bocd-v, bocd, window).
        threshold: Relative rise that opens an event (and the verification threshold of bocd-v).
        quorum: Fraction of a job's ranks whose detector must see the slowdown to open the job's event.
        dtype: Precision of the BOCD state (float32 halves memory and time at thousands of ranks).
        snapshot_every: Polls between snapshots of the detector state to Redis.
        culprit_window_s: Longest window of the per-communicator averages used for culprit analysis.
        culprit_every: Polls between re-runs of culprit analysis while an event is open.
        max_suspects: Most suspect series exported per job (bounded label sets).
        stale_after_s: A (job, rank) series without a new sample for this long is dropped (detector
            state, and once a job has no series left, its exported series and Redis event): jobs end.
        shards: Detector replicas the jobs are split over (1: this one watches every job).
        shard: This replica's number, 0 .. ``shards`` - 1: it watches the jobs whose Prometheus
            ``hashmod`` of the job label, modulo ``shards``, is ``shard`` (`detector.shard`).
    """

    model_config = SettingsConfigDict(env_prefix="FAILSLOW_DETECTOR_", extra="ignore")

    prometheus_url: str = "http://127.0.0.1:9090"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "failslow:detector"
    port: int = Field(9402, ge=0, le=65535)
    address: str = "0.0.0.0"
    poll_interval_s: float = Field(15.0, gt=0)
    query_timeout_s: float = Field(10.0, gt=0)
    metric: str = "failslow_iteration_duration_seconds"
    samples_metric: str = "failslow_iteration_samples"
    method: str = "bocd-v"
    threshold: float = Field(0.10, gt=0, lt=10)
    quorum: float = Field(0.5, gt=0, le=1)
    dtype: str = Field("float32", pattern="^float(32|64)$")
    snapshot_every: int = Field(20, ge=1)
    culprit_window_s: float = Field(300.0, gt=0)
    culprit_every: int = Field(20, ge=1)
    max_suspects: int = Field(4, ge=1, le=64)
    stale_after_s: float = Field(600.0, gt=0)
    shards: int = Field(1, ge=1)
    shard: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _shard_in_range(self) -> Self:
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} is out of range: with shards={self.shards} the replicas are "
                             f"numbered 0..{self.shards - 1} (FAILSLOW_DETECTOR_SHARD < FAILSLOW_DETECTOR_SHARDS)")
        return self
