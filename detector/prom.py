"""A small client for the Prometheus HTTP API: instant queries that return labelled values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests


class PromUnavailable(RuntimeError):
    """Prometheus did not answer or answered with an error; the caller waits and retries."""


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


def parse_vector(doc: dict[str, Any]) -> list[Sample]:
    """The samples of an instant-vector query response (pure: tested with literals)."""
    if doc.get("status") != "success":
        raise PromUnavailable(f"query failed: {doc.get('errorType')}: {doc.get('error')}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise PromUnavailable(f"expected a vector, got {data.get('resultType')!r}")
    out = []
    for item in data.get("result", []):
        try:
            out.append(Sample(labels=dict(item["metric"]), value=float(item["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PromUnavailable(f"malformed sample {item!r}: {exc}") from exc
    return out


class PromClient:
    """Instant queries against ``base_url`` (``/api/v1/query``)."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = session or requests.Session()

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """Evaluate ``expr`` now (or at unix time ``at``); raises PromUnavailable on any failure."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            resp = self.session.post(f"{self.base_url}/api/v1/query", data=params, timeout=self.timeout_s)
            doc = resp.json()
        except (requests.RequestException, ValueError) as exc:
            raise PromUnavailable(f"{self.base_url}: {exc}") from exc
        if resp.status_code >= 400 and doc.get("status") != "error":
            raise PromUnavailable(f"{self.base_url}: HTTP {resp.status_code}")
        return parse_vector(doc)
