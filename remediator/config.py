"""The remediator's config file: which adapter acts on which job, and the planner's policy and costs.

```yaml
jobs:                         # first match wins; a job that matches nothing is only planned, never acted on
  - match: "llm-.*"           # regular expression, matched against the whole `job` label
    adapter: slurm            # testbed | slurm | command | torchrun | fake
    options: {job_name: "{job}"}
policy:                       # failslow.plan.policy.Policy fields
  cooldown_s: 60
  approval: [restart]
costs:                        # seconds of lost training per strategy, until the adapter measured them
                              # (over the adapter's own estimate for the job, which is over the defaults)
  restart: 120
```

Reading (:func:`read_config`) is separate from parsing (:func:`parse_config`, pure, tested with literals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from failslow.errors import InputError
from failslow.plan.policy import STRATEGIES, Costs, Policy
from remediator.adapters import ADAPTERS


@dataclass(frozen=True)
class JobRule:
    """One ``jobs:`` entry."""

    match: re.Pattern[str]
    adapter: str
    options: dict[str, Any] = field(default_factory=dict)

    def matches(self, job: str) -> bool:
        """Whether the rule covers `job` (whole-label match)."""
        return self.match.fullmatch(job) is not None


@dataclass(frozen=True)
class RemediatorConfig:
    """The parsed config file (defaults: no job mapped, the default policy and costs)."""

    jobs: tuple[JobRule, ...] = ()
    policy: Policy = field(default_factory=Policy)
    costs: Costs = field(default_factory=Costs)
    costs_given: frozenset[str] = frozenset()  # the strategies whose cost the file set (the rest are defaults)

    def rule_for(self, job: str) -> JobRule | None:
        """The first rule covering `job`."""
        return next((r for r in self.jobs if r.matches(job)), None)


def parse_config(doc: Any) -> RemediatorConfig:
    """Parse the config document (the YAML's top-level mapping; None = empty).

    Raises:
        InputError: anything unknown or ill-typed, with where it is.
    """
    if doc is None:
        return RemediatorConfig()
    if not isinstance(doc, dict):
        raise InputError("config: the top level must be a mapping")
    unknown = set(doc) - {"jobs", "policy", "costs"}
    if unknown:
        raise InputError(f"config: unknown keys {sorted(unknown)} (jobs, policy, costs)")
    rules: list[JobRule] = []
    jobs = doc.get("jobs")
    jobs = [] if jobs is None else jobs
    if not isinstance(jobs, list):
        raise InputError("config: jobs must be a list")
    for i, item in enumerate(jobs):
        where = f"config: jobs[{i}]"
        if not isinstance(item, dict) or set(item) - {"match", "adapter", "options"}:
            raise InputError(f"{where}: a mapping with match, adapter and options")
        if not isinstance(item.get("match"), str) or not isinstance(item.get("adapter"), str):
            raise InputError(f"{where}: match and adapter must be strings")
        try:
            pat = re.compile(item["match"])
        except re.error as exc:
            raise InputError(f"{where}: match {item['match']!r}: {exc}") from None
        if item["adapter"] not in ADAPTERS:
            raise InputError(f"{where}: unknown adapter {item['adapter']!r} (known: {', '.join(sorted(ADAPTERS))})")
        options = item.get("options")
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise InputError(f"{where}: options must be a mapping")
        rules.append(JobRule(pat, item["adapter"], dict(options)))
    policy = _policy(doc.get("policy") or {})
    costs_doc = doc.get("costs") or {}
    if not isinstance(costs_doc, dict) or set(costs_doc) - set(STRATEGIES):
        raise InputError(f"config: costs must map strategies ({', '.join(STRATEGIES)}) to seconds")
    try:
        costs = Costs(**{k: float(v) for k, v in costs_doc.items()})
    except (TypeError, ValueError):
        raise InputError("config: costs must be numbers of seconds") from None
    if any(v < 0 for v in costs_doc.values()):
        raise InputError("config: costs must be >= 0")
    return RemediatorConfig(tuple(rules), policy, costs, frozenset(costs_doc))


def _policy(doc: Any) -> Policy:
    if not isinstance(doc, dict):
        raise InputError("config: policy must be a mapping")
    names = {f.name for f in fields(Policy)}
    unknown = set(doc) - names
    if unknown:
        raise InputError(f"config: unknown policy keys {sorted(unknown)} (known: {sorted(names)})")
    kw: dict[str, Any] = {}
    for k, v in doc.items():
        if k in ("approval", "validate_before"):
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise InputError(f"config: policy {k} must be a list of strategies")
            kw[k] = frozenset(v)
        elif k == "max_actions_per_hour":
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(f"config: policy {k} must be an integer")
            kw[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InputError(f"config: policy {k} must be a number")
            kw[k] = float(v)
    return Policy(**kw)


def read_config(path: str | Path | None) -> RemediatorConfig:
    """Read and parse the config file (None: the defaults).

    Raises:
        InputError: unreadable file, bad YAML or a bad config.
    """
    if path is None:
        return RemediatorConfig()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"config {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"config {path}: not YAML: {exc}") from None
    return parse_config(doc)
