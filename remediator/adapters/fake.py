"""A fake adapter inside the package (like dcgm-exporter's fake GPUs): records what it is asked, acts on
nothing. For trying the remediator's planning and API on jobs without touching them, and for tests.

Options: ``capabilities`` (list, default every strategy), ``microbatches`` (list, default ``[4, 4]``),
``nodes`` (list of names, default ``["node0", "node1"]``), ``placement`` (default: ranks spread over the
nodes, one per DP replica), ``spare_nodes`` (list of names; default unknown, as a scheduler that finds
nodes itself), ``fail`` (list of strategies that fail), ``delay_s`` (seconds each action
takes, default 0), ``expected_costs`` (strategy -> seconds: what the adapter says the job's actions will
cost, ``JobInfo.costs``; default none), ``record`` (a file each action appends one JSON line to: the test's evidence of what
was executed, across processes).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from remediator.adapters.base import (
    STRATEGY_NAMES,
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    option,
    render,
    strategy_costs,
)


class Adapter:
    """:class:`remediator.adapters.base.TrainingAdapter` that only records."""

    kind: ClassVar[str] = "fake"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any]) -> None:
        unknown = set(options) - {"capabilities", "microbatches", "nodes", "spare_nodes", "placement", "fail",
                                 "delay_s", "record", "expected_costs"}
        if unknown:
            raise ConfigError(f"fake adapter: unknown options {sorted(unknown)}")
        caps = option(options, "capabilities", list, list(STRATEGY_NAMES))
        if set(caps) - set(STRATEGY_NAMES):
            raise ConfigError(f"fake adapter: unknown capabilities {sorted(set(caps) - set(STRATEGY_NAMES))}")
        self.job = job
        self.caps = frozenset(caps)
        self.microbatches = [int(x) for x in option(options, "microbatches", list, [4, 4])]
        self.nodes = [str(x) for x in option(options, "nodes", list, ["node0", "node1"])]
        default_placement = [i % len(self.nodes) for i in range(len(self.microbatches))]
        self.placement = [int(x) for x in option(options, "placement", list, default_placement)]
        spares = option(options, "spare_nodes", list, None)
        self.spare_nodes = None if spares is None else [str(x) for x in spares]
        self.fail = set(option(options, "fail", list, []))
        self.delay_s = float(option(options, "delay_s", (int, float), 0.0))
        costs = strategy_costs(option(options, "expected_costs", dict, {}))
        if costs is None:
            raise ConfigError("fake adapter: expected_costs maps strategies to seconds >= 0")
        self.expected_costs = costs
        rec = option(options, "record", str, "")
        self.record = Path(render(rec, job, labels)) if rec else None
        self.executed: list[ActionRequest] = []
        self._lock = threading.Lock()

    def capabilities(self) -> frozenset[str]:
        """As configured."""
        return self.caps

    def info(self) -> JobInfo:
        """As configured, with the split of the last rebalance."""
        return JobInfo(layout={"dp": len(self.microbatches), "pp": 1, "tp": 1, "ranks_per_node": 1},
                       placement=list(self.placement), nodes=list(self.nodes), microbatches=list(self.microbatches),
                       spare_nodes=None if self.spare_nodes is None else list(self.spare_nodes),
                       costs=dict(self.expected_costs))

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Record the request; a configured failure raises."""
        with self._lock:
            self.executed.append(request)
            if self.record is not None:
                with open(self.record, "a") as f:
                    f.write(json.dumps({"id": request.id, "job": request.job, "strategy": request.strategy,
                                        "params": dict(request.params), "t": time.time()}) + "\n")
        if self.delay_s:
            time.sleep(self.delay_s)
        if request.strategy in self.fail:
            raise AdapterError(f"fake {request.strategy} failure (configured)")
        result: dict[str, Any] = {"params": dict(request.params)}
        if request.strategy == "rebalance":
            self.microbatches = [int(x) for x in request.params.get("counts") or self.microbatches]
        if request.strategy == "validate":  # the fake confirms every suspect it is asked about
            result.update(confirmed=True, ranks=list(request.params.get("ranks") or []),
                          nodes=list(request.params.get("nodes") or []))
        return ActionOutcome(True, f"fake {request.strategy}", result, pause_s=0.0, iterations_lost=0)

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """What the record file says of the action (None when it has no line for it)."""
        if self.record is None or not self.record.exists():
            return None
        for line in self.record.read_text().splitlines():
            if json.loads(line).get("id") == request.id:
                return ActionOutcome(True, f"fake {request.strategy} (recovered from the record)")
        return None
