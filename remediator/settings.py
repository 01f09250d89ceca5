"""Remediator configuration: one `Settings`, read from ``FAILSLOW_REMEDIATOR_*`` variables in `main()`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the remediator service can be told; built once in `main()` and passed down.

    Attributes:
        host: Address to bind (the shipped alertmanager.yml calls 127.0.0.1:8000).
        port: HTTP port of the webhook, the API, the status page and ``/metrics``.
        redis_url: Redis holding events, actions, locks and the audit stream (run it with persistence:
            appendonly, so a Redis restart loses nothing).
        redis_prefix: Prefix of every Redis key the remediator owns.
        token_file: File holding the bearer token every POST (and, unless ``open_reads``, every read) needs.
        prometheus_url: Prometheus the job's pace is read from.
        mode: ``dry-run`` (default: plans and audits, acts on nothing) or ``auto`` (acts).
        config: YAML file mapping jobs to adapters and overriding the policy and costs (docs/remediator.md).
        open_reads: Serve the JSON reads and the status page without the token (trusted networks only).
        tick_s: Seconds between planner passes over the open events.
        query_timeout_s: Timeout of one Prometheus or Redis request.
        lock_lease_s: Lease of a job's planning lock and of a running action's liveness mark: a replica
            that dies mid-action is noticed after this long and the action is recovered, never repeated.
        dedupe_ttl_s: How long a delivery key (fingerprint|startsAt|status) is remembered. Alertmanager
            repeats a firing alert every repeat_interval with the same startsAt for as long as it fires.
        confirm_timeout_s: After the alert resolved, how long to wait for the pace to be confirmed back
            before the event is closed as "not confirmed".
        ineffective_ttl_s: How long a strategy that did not help a job is not tried on it again.
        max_body_bytes: Larger request bodies are refused with 413.
        stale_after_s: A job whose newest iteration is older than this has no current pace.
        audit_max_entries: The audit stream is trimmed to about this many newest entries (0: never trimmed).
        exporter_window_iterations: Iterations the exporters average each rank's compute over (their
            ``window`` setting): a reading is clean of the time before a change (the onset, an action) only
            this many iterations after it.
        compute_average_s: Longest stretch the pace model's per-rank compute is averaged over (0: the newest
            reading only). A reading over the exporter's window alone follows swings of tens of seconds that
            an action does not keep (on the testbed, a CPU quota's period beating with the iteration); the
            average runs from a clean reading after the onset or the event's last action to now.
        compute_shift: A rank whose mean over the newest stretch of the average (the exporter's window, at
            least 10 s) differs from its mean before it by more than this share changed inside the stretch
            (recovered, or slowed): its newest stretch stands for it.
        replica: Name of this replica in locks and the audit (default: host and PID).
    """

    model_config = SettingsConfigDict(env_prefix="FAILSLOW_REMEDIATOR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "failslow:remediator"
    token_file: str = "/etc/failslow/remediator.token"
    prometheus_url: str = "http://127.0.0.1:9090"
    mode: str = Field("dry-run", pattern="^(dry-run|auto)$")
    config: str | None = None
    open_reads: bool = False
    tick_s: float = Field(5.0, gt=0)
    query_timeout_s: float = Field(5.0, gt=0)
    lock_lease_s: float = Field(30.0, gt=0)
    dedupe_ttl_s: float = Field(7 * 86400.0, gt=0)
    confirm_timeout_s: float = Field(600.0, gt=0)
    ineffective_ttl_s: float = Field(6 * 3600.0, gt=0)
    max_body_bytes: int = Field(1 << 20, ge=1024)
    stale_after_s: float = Field(60.0, gt=0)
    audit_max_entries: int = Field(1_000_000, ge=0)
    exporter_window_iterations: int = Field(20, ge=0)
    compute_average_s: float = Field(120.0, ge=0)
    compute_shift: float = Field(0.2, gt=0)
    replica: str | None = None
