"""Mitigation planning, pure: which strategy pays off now, and its parameters.

`policy` is the ski-rental planner (FALCON's adaptive multi-level mitigation, gated by a prediction of the
iteration time after each action); `pace` models a job's iteration time from its per-rank compute times so
that a prediction can be made; `microbatch` is the exact S2 solver (micro-batches over DP groups);
`placement` is the S3 topology planner (node permutations scored by an iteration-time model; its parts are the
`placement_*` modules); `validate` judges FALCON's validation measurements (`validate_schedule`: which links
to test in which round).
"""

from __future__ import annotations

from failslow.plan.microbatch import Rebalance, rebalance
from failslow.plan.placement import PlacementModel, PlacementParams, TopologyPlan, plan_topology

__all__: list[str] = ["PlacementModel", "PlacementParams", "Rebalance", "TopologyPlan", "plan_topology", "rebalance"]
