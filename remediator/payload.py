"""What the remediator accepts over HTTP: Alertmanager's webhook payload (version 4) and the manual request.

Parsing is strict: a payload that does not have the documented shape is refused with 422 before anything is
stored, because Alertmanager treats every 4xx as permanent and would never send it in a better shape. Fields
Alertmanager may add later are ignored; a different ``version`` is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Alertmanager caps a group's alerts with max_alerts; beyond this we refuse rather than take minutes.
MAX_ALERTS = 1000
LABEL_MAX = 1024


class Alert(BaseModel):
    """One alert of a notification."""

    model_config = ConfigDict(extra="ignore", strict=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime | None = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("labels", "annotations")
    @classmethod
    def _bounded(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 64 or any(len(k) > LABEL_MAX or len(x) > 16 * LABEL_MAX for k, x in v.items()):
            raise ValueError("too many or too long labels/annotations")
        return v

    @property
    def key(self) -> str:
        """The delivery identity: fingerprint|startsAt|status (Alertmanager has no idempotency header)."""
        return f"{self.fingerprint}|{self.starts_at_s:.3f}|{self.status}"

    @property
    def starts_at_s(self) -> float:
        """startsAt as Unix seconds."""
        return self.starts_at.timestamp()


class Notification(BaseModel):
    """Alertmanager's webhook payload, version 4."""

    model_config = ConfigDict(extra="ignore", strict=True)

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = ""
    group_key: str = Field("", alias="groupKey")
    truncated_alerts: int = Field(0, ge=0, alias="truncatedAlerts")
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field("", alias="externalURL")
    alerts: list[Alert] = Field(min_length=1, max_length=MAX_ALERTS)


class SuspectIn(BaseModel):
    """A suspect named by a person in a manual request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["compute", "link"]
    rank: int | None = Field(None, ge=0)
    node: str = Field("", max_length=256)


class RemediateRequest(BaseModel):
    """``POST /remediate``: a person asks for a plan (and, in auto mode or with dry_run false, an action)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: str = Field(min_length=1, max_length=256)
    suspects: list[SuspectIn] = Field(default_factory=list, max_length=64)
    action: Literal["auto", "validate", "rebalance", "topology", "restart"] = "auto"
    dry_run: bool | None = None
    reason: str = Field("", max_length=1000)
    approve: bool = False
