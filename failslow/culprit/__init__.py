"""Culprit analysis: from per-rank call timings, tell the slow rank (compute) or slow link from their victims.

What it is for: once a job is confirmed slow, naming *who* to fix. Everybody in a synchronous job slows
down together, so iteration times cannot say who is guilty; the timing of communication calls can.

Every collective call instance (the k-th call on a communicator, matched across its members) splits into

* **wait**: from a rank's entry until the last peer arrives (``max(start) - start``), time spent waiting
  for somebody else, and
* **transfer**: from the last arrival to the rank's exit (``end - max(start)``), time the data took.

Point-to-point calls are matched as the k-th send from ``a`` to ``b`` with the k-th receive at ``b``
from ``a`` and split the same way. Then:

* **link suspects**: a group (communicator, or a directed p2p pair) whose median transfer time per byte
  is at least ``link_ratio`` (1.1×) the median of the groups of the same kind (same op, size and parallel
  role). The slow groups are then projected onto nodes: the node that the slow groups share and the
  healthy groups avoid is the suspect link (its uplink); a slow group confined to one node points at
  that node's local fabric.
* **compute suspects**: ranks everyone waits for. A rank slowed by its CPU/GPU spends *more* time outside
  communication calls than the ranks doing the same work (its data-parallel peers), and arrives last to
  its collectives; its victims spend the extra time *inside* calls (waiting), so their time outside
  calls stays normal. A rank is a suspect when its time outside calls is at least ``compute_ratio``
  (1.1×) the median of its peers.
* **stage suspects** (a compute suspect naming a whole pipeline stage): when every data-parallel rank of
  a stage is slow alike (a stage holding too many layers, longer sequences on one stage), comparing ranks
  with their DP peers sees nothing. Stages are compared with each other instead: the time outside calls
  of the stage's *fastest* rank, per unit of work the stage holds (layers, when known), against the
  median of the other stages. A stage at least ``stage_ratio`` (1.3×) the others is named with all its
  ranks (rank suspects inside it are explained by it; rank suspects elsewhere must explain at least as
  much extra time as the stage, else they are hidden behind the bottleneck); how much of the p2p
  waiting between it and its neighbours is theirs (they wait in receives for its sends) is part of the
  evidence and the confidence.
* **after a rebalance** DP peers run unequal micro-batch counts: their pipeline sends tell the counts, and
  each rank is compared at its group's mean count (``suspects.at_mean_work``: the compute outside the
  pipeline, which does not scale, kept as it is).

Each culprit comes with the evidence used and a confidence in [0, 1].

Input: the call table (`failslow.record.Calls`, from ring records). Modules: ``instances`` (call instances matched across
a communicator's members, the wait/transfer split), ``analysis`` (:func:`analyse`: DP peers, cross-stage
comparison, node map), ``aggregates`` (:func:`analyse_aggregates`, from per-window averages),
``suspects`` (the verdicts both share: stage suspects, reconciliation, link localisation) and
``results`` (:class:`Analysis`, :class:`Culprit`). See docs/detector.md.
"""

from failslow.culprit.aggregates import analyse_aggregates
from failslow.culprit.analysis import analyse
from failslow.culprit.instances import Instance, match_instances
from failslow.culprit.results import Analysis, Culprit, GroupStat, RankStat

__all__ = [
    "Analysis",
    "Culprit",
    "GroupStat",
    "Instance",
    "RankStat",
    "analyse",
    "analyse_aggregates",
    "match_instances",
]
