"""The testbed adapter: acts on a running ``failslow testbed run --run-dir DIR`` through its request files.

Options:

* ``run_dir`` (required, a template: ``{job}`` and alert labels may be used) — the job's run directory;
* ``timeout_s`` (default 240) — how long one request may take (a restart checkpoints, stops and respawns);
* ``progress_timeout_s`` (default 120) — after a restart, how long to wait for the first new iteration,
  which is when the pause is measured.

Capabilities: ``validate`` (FALCON's validation stage: ``ranks`` run a short GEMM benchmark beside one
healthy peer each, ``nodes`` have their links measured — the job's nodes form one ring tested in two or three
rounds of disjoint point-to-point pairs, the links away from the suspects being the reference; both at an
iteration boundary, by the training processes themselves. The outcome's result follows the contract of
:mod:`remediator.adapters.base`: ``confirmed`` (any suspect confirmed), ``ranks`` and ``nodes`` (the confirmed
suspects), ``paths`` (slow links no named node explains: ``[node a, node b, bandwidth share]``, a congested
path the S3 planner can move), plus ``cleared_ranks``, ``cleared_nodes`` and the job's verdicts and numbers under
``compute`` and ``links``; ``pause_s`` is the measured extra iteration time the tests cost, ``iterations_lost`` 0. Thresholds:
:mod:`failslow.plan.validate`), ``rebalance`` (the split applies at a near-future iteration boundary, the global batch and so
the gradient unchanged: no pause), ``topology`` (checkpoint, stop, restart with the given rank-to-node
placement; with ``counts``, the split the placement was scored with from the first boundary after it) and ``restart`` (S4: the same, without the excluded nodes — ``exclude_nodes``, plus the nodes of
``exclude_ranks``; with ``counts``, the job's own split back from the first boundary after it). A job started with ``--spare-nodes N`` has idle nodes (the ``status`` answer's
``spare_nodes``): each excluded node's ranks then move, all together, onto a spare of their own
(:func:`onto_spares`), so TP groups stay on one node and the traffic pattern is the one the job had; only
when no spare is free do they spread over the healthy nodes that hold the fewest ranks (:func:`move_off`;
the testbed refuses a node with more than ``ranks_per_node`` ranks, so on a job whose nodes are full this
fallback is refused rather than oversubscribing a node). The outcome's result says which: ``mode``
(``spares``, ``spares+move_off``, ``move_off``, or ``in_place`` when nothing was excluded), ``moved``
(``{"node1": "node4"}``), ``spares_used`` and ``excluded``, beside ``placement``, ``previous_placement``
and ``resumed_iteration``; the pause and the iterations lost are measured after the first new iteration.
Nodes are named ``node0``, ``node1``, … as in the testbed, spares included. Every request file is named by
the action id, so :meth:`Adapter.recover` reads the job's answer to an action the remediator was killed
in the middle of instead of sending it again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from failslow.control import ControlTimeout, RunDirClient
from failslow.errors import InputError
from failslow.topology import Layout
from remediator.adapters.base import (
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    option,
    render,
)


def _vid(action_id: str, part: str) -> str:
    """The request id of one part of a validation (the run directory's ids allow letters, digits, - _ .)."""
    return f"{action_id}-{part}"


def node_name(i: int) -> str:
    """The testbed's name of node `i`."""
    return f"node{i}"


def move_off(placement: list[int], num_nodes: int, bad: set[int]) -> list[int]:
    """The placement with every rank on a `bad` node moved to the healthy node holding the fewest ranks.

    Raises:
        AdapterError: every node is bad.
    """
    good = [n for n in range(num_nodes) if n not in bad]
    if not good:
        raise AdapterError(f"no healthy node left to move ranks to (bad: {sorted(bad)})")
    load = {n: sum(1 for p in placement if p == n) for n in good}
    out = list(placement)
    for r, n in enumerate(placement):
        if n in bad:
            dest = min(good, key=lambda g: (load[g], g))
            out[r] = dest
            load[dest] += 1
    return out


def onto_spares(placement: list[int], num_nodes: int, ranks_per_node: int | None, bad: set[int],
                spares: list[int]) -> tuple[list[int], dict[int, int]]:
    """The placement with each `bad` node's ranks moved, all together, onto a spare node of its own (S4).

    Keeping a node's ranks together keeps its TP group (and whatever else shared the node) on one node, so
    the job's traffic pattern is the one it had, only without the bad node. Bad nodes are served in index
    order, each taking the lowest free spare; bad nodes holding no rank need none. A bad node left over when
    the spares run out keeps its ranks (the returned mapping lacks it): the caller decides what then.

    Args:
        placement: Node of each rank now.
        num_nodes: Nodes of the cluster, spares included.
        ranks_per_node: Ranks a node can hold (None: no limit).
        bad: Nodes to move off.
        spares: Candidate spare nodes; those that are bad, hold a rank or are outside the cluster are skipped.

    Returns:
        The new placement and ``{bad node: spare node}`` for every bad node that was moved.

    Raises:
        AdapterError: a bad node holds more ranks than a node can (the placement is broken).
    """
    used = set(placement)
    free = sorted({s for s in spares if 0 <= s < num_nodes and s not in bad and s not in used})
    out = list(placement)
    moved: dict[int, int] = {}
    for node in sorted(bad):
        ranks = [r for r, n in enumerate(placement) if n == node]
        if not ranks:
            continue
        if ranks_per_node is not None and len(ranks) > ranks_per_node:
            raise AdapterError(f"node {node} holds {len(ranks)} ranks, more than a node can ({ranks_per_node})")
        if not free:
            break
        moved[node] = free.pop(0)
        for r in ranks:
            out[r] = moved[node]
    return out, moved


class Adapter:
    """:class:`remediator.adapters.base.TrainingAdapter` for a testbed job."""

    kind: ClassVar[str] = "testbed"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any]) -> None:
        self.job = job
        self.run_dir = Path(render(option(options, "run_dir", str), job, labels))
        self.timeout_s = float(option(options, "timeout_s", (int, float), 240.0))
        self.progress_timeout_s = float(option(options, "progress_timeout_s", (int, float), 120.0))
        unknown = set(options) - {"run_dir", "timeout_s", "progress_timeout_s"}
        if unknown:
            raise ConfigError(f"testbed adapter: unknown options {sorted(unknown)}")

    def _client(self) -> RunDirClient:
        try:
            return RunDirClient(self.run_dir, self.timeout_s)
        except InputError as exc:
            raise AdapterError(str(exc)) from None

    def _request(self, action: str, rid: str | None = None, timeout_s: float | None = None, **args: Any) -> Any:
        try:
            return self._client().request(action, rid, timeout_s, **args)
        except ControlTimeout as exc:
            raise AdapterError(str(exc), transient=True) from None
        except InputError as exc:
            raise AdapterError(f"testbed refused {action}: {exc}") from None

    def capabilities(self) -> frozenset[str]:
        """Validation, micro-batch splits, placements and restarts."""
        return frozenset({"validate", "rebalance", "topology", "restart"})

    def status(self) -> dict[str, Any]:
        """The testbed's status answer."""
        st: dict[str, Any] = self._request("status", timeout_s=min(self.timeout_s, 30.0))
        return st

    def info(self) -> JobInfo:
        """Layout, placement, node names, the current micro-batch split and the testbed's expected costs."""
        st = self.status()
        return JobInfo(layout=st["layout"], placement=list(st["placement"]),
                       nodes=[node_name(i) for i in range(int(st["num_nodes"]))],
                       spare_nodes=[node_name(int(i)) for i in st.get("spare_nodes") or []],
                       microbatches=list(st["microbatches"]), traffic=dict(st.get("traffic") or {}),
                       costs={str(k): float(v) for k, v in (st.get("expected_costs") or {}).items()},
                       extra={"run_dir": str(self.run_dir), "completed": st["completed"], "faults": st["faults"]})

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Carry out one action (the request file is named by the action id)."""
        p = request.params
        if request.strategy == "validate":
            return self._validate(request)
        if request.strategy == "rebalance":
            counts = [int(c) for c in p.get("counts") or []]
            frm = self._request("set_microbatches", request.id, counts=counts)
            return ActionOutcome(True, f"micro-batches {counts} from iteration {frm}",
                                 {"counts": counts, "from_iteration": frm}, pause_s=0.0, iterations_lost=0)
        if request.strategy in ("restart", "topology"):
            before = self.status()
            extra: dict[str, Any] = {}
            if request.strategy == "topology":
                placement = [int(x) for x in p.get("placement") or []]
            else:
                placement, extra = self._exclude(before, p)
            resumed = self._request("restart", request.id, placement=placement)
            # topology: the split the placement was scored with; restart: the job's own split, the slow node
            # gone; either from the first boundary after the restart
            counts = [int(c) for c in p.get("counts") or []]
            if counts:
                frm = self._request("set_microbatches", f"{request.id}-split", counts=counts)
                extra = {**extra, "counts": counts, "counts_from_iteration": frm}
            return self._after_restart(request, before, placement, int(resumed), extra)
        raise AdapterError(f"the testbed adapter cannot {request.strategy}")

    @staticmethod
    def _exclude(before: dict[str, Any], p: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """S4's placement: the excluded nodes' ranks onto spares (each node's onto one), else spread out."""
        num_nodes = int(before["num_nodes"])
        names = [node_name(i) for i in range(num_nodes)]
        unknown = [n for n in p.get("exclude_nodes") or [] if n not in names]
        if unknown:
            raise AdapterError(f"nodes {unknown} are not nodes of this job ({names})")
        current = [int(n) for n in before["placement"]]
        bad = {names.index(n) for n in p.get("exclude_nodes") or []}
        for r in p.get("exclude_ranks") or []:  # a bad rank's node goes with it (its device is the suspect)
            if not isinstance(r, int) or not 0 <= r < len(current):
                raise AdapterError(f"rank {r!r} is not a rank of this job (0..{len(current) - 1})")
            bad.add(current[r])
        rpn = (before.get("layout") or {}).get("ranks_per_node")
        spares = [int(s) for s in before.get("spare_nodes") or []]
        placement, moved = onto_spares(current, num_nodes, int(rpn) if rpn else None, bad, spares)
        left = {n for n in bad if n in placement}
        if left:  # no spare (left) for these: spread their ranks over the healthy nodes with the fewest ranks
            placement = move_off(placement, num_nodes, bad)
        # nothing excluded: a restart in place, as before (it still clears what a fresh process clears)
        how = "in_place" if not bad else "spares" if not left else "spares+move_off" if moved else "move_off"
        return placement, {"mode": how, "moved": {node_name(b): node_name(s) for b, s in moved.items()},
                           "spares_used": [node_name(s) for s in moved.values()],
                           "excluded": [node_name(n) for n in sorted(bad)]}

    def _after_restart(self, request: ActionRequest, before: dict[str, Any], placement: list[int],
                       resumed: int, extra: Mapping[str, Any] | None = None) -> ActionOutcome:
        """Wait for the first iteration after the restart and measure the pause it caused."""
        deadline = time.monotonic() + self.progress_timeout_s
        st = self.status()
        while st["completed"] <= resumed and time.monotonic() < deadline:
            time.sleep(0.2)
            st = self.status()
        lost = max(0, int(before["completed"]) - resumed)
        pause = None
        if st.get("restart_pause_s") is not None and st.get("resume_iteration") == resumed:
            # the job's own measure: no rank trained from the last iteration before the restart to the first
            # after it (the estimate below counts iterations after the restart at the pace before it, which
            # is wrong exactly when the restart cured a slow pace)
            pause = float(st["restart_pause_s"])
        elif st["completed"] > resumed and st.get("last_iteration_end_unix") \
                and before.get("last_iteration_end_unix"):
            # one iteration of the gap is the iteration itself; the rest is the pause
            typical = float(before.get("recent_iteration_s") or 0.0)
            pause = max(0.0, float(st["last_iteration_end_unix"]) - float(before["last_iteration_end_unix"])
                        - typical * (int(st["completed"]) - int(before["completed"])))
        ok = st["completed"] > resumed
        moved = dict((extra or {}).get("moved") or {})
        onto = f" ({', '.join(f'{b} -> {s}' for b, s in moved.items())})" if moved else ""
        detail = (f"restarted at iteration {resumed} with placement {placement}{onto}"
                  + ("" if ok else f"; no iteration within {self.progress_timeout_s:.0f} s after it"))
        return ActionOutcome(ok, detail, {"placement": placement, "resumed_iteration": resumed,
                                          "previous_placement": before["placement"], **(extra or {})},
                             pause_s=pause, iterations_lost=lost)

    def _validate(self, request: ActionRequest) -> ActionOutcome:
        """Validate the suspects: GEMM benchmark for ranks, O(1)-round link test for nodes (module docstring)."""
        ranks, suspects = _validate_params(request.params)
        before = self.status()
        names = [node_name(i) for i in range(int(before["num_nodes"]))]
        unknown = [n for n in suspects if n not in names]
        if unknown:
            raise AdapterError(f"nodes {unknown} are not nodes of this job ({names})")
        answers: dict[str, Any] = {}
        if ranks:
            answers["compute"] = self._request("validate_compute", _vid(request.id, "compute"), ranks=ranks)
        if suspects:
            # every node holding ranks in one ring (2-3 rounds whatever its size), ordered DP group by DP
            # group so that every DP link (the heavy traffic) is a ring edge, and each node also gets a link
            # to another group: a slow NIC slows both its links, a congested path only its own
            ring = dp_ring(Layout.from_mapping(before["layout"]), list(before["placement"]))
            answers["links"] = self._request("validate_links", _vid(request.id, "links"), nodes=ring,
                                             suspects=[names.index(n) for n in suspects])
        return _validation_outcome(suspects, answers)

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """The job's answer to the action's request file, waiting for it while the job still works on it."""
        client = self._client()
        if request.strategy == "validate":
            return self._recover_validate(request, client)
        # Not answered yet: the launcher may be working on it (it removes the request file when it starts),
        # or the remediator died before writing it; only the answer can tell, so wait for it.
        try:
            client.wait(request.id, timeout_s=self.timeout_s)
        except ControlTimeout:
            return None
        except InputError:
            pass  # refused: the answer says why
        ans = client.answer(request.id)
        if ans is None:
            return None
        if not ans.get("ok"):
            return ActionOutcome(False, f"testbed refused {request.strategy}: {ans.get('error')}")
        return ActionOutcome(True, f"{request.strategy} done before the remediator restarted: {ans.get('result')}",
                             {"result": ans.get("result")})

    def _recover_validate(self, request: ActionRequest, client: RunDirClient) -> ActionOutcome | None:
        """A validation's outcome from its parts' answers (``<id>-compute``, ``<id>-links``); None when a part
        has none (never sent, or the job is gone): a half-known validation confirms nothing."""
        try:
            ranks, suspects = _validate_params(request.params)
        except AdapterError:
            return None
        answers: dict[str, Any] = {}
        for part, wanted in (("compute", ranks), ("links", suspects)):
            if not wanted:
                continue
            rid = _vid(request.id, part)
            try:  # a validation takes seconds: wait a little for one the job may still be running
                answers[part] = client.wait(rid, timeout_s=min(self.timeout_s, 60.0))
            except ControlTimeout:
                return None
            except InputError as exc:
                return ActionOutcome(False, f"testbed refused validate ({part}): {exc}")
        return _validation_outcome(suspects, answers)


def dp_ring(layout: Layout, placement: list[int]) -> list[int]:
    """The job's nodes, each once, in the order of the DP groups' members (see :meth:`TestbedAdapter._validate`)."""
    ring: list[int] = []
    for group in layout.groups("dp"):
        for r in group:
            if placement[r] not in ring:
                ring.append(int(placement[r]))
    return ring


def _validate_params(p: Mapping[str, Any]) -> tuple[list[int], list[str]]:
    """Suspect ranks and node names of a validate action.

    Raises:
        AdapterError: ranks that are not integers, or nothing to validate.
    """
    ranks = list(p.get("ranks") or [])
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise AdapterError(f"ranks must be integers, got {ranks!r}")
    suspects = [str(n) for n in p.get("nodes") or []]
    if not ranks and not suspects:
        raise AdapterError("nothing to validate: no suspect rank or node")
    return ranks, suspects


def paths_of_slow_links(links: Mapping[str, Any]) -> list[list[Any]]:
    """Slow links that no named node explains: ``[node a, node b, bandwidth share left]`` (a congested path
    between two healthy NICs, which the S3 planner can move out of the heavy traffic)."""
    named = {int(n) for n in links.get("nodes") or []}
    out: list[list[Any]] = []
    for e in (links.get("verdict") or {}).get("links") or []:
        if e.get("slow") and int(e["a"]) not in named and int(e["b"]) not in named:
            share = float(e.get("bandwidth_ratio") or 1.0)
            out.append([node_name(int(e["a"])), node_name(int(e["b"])), round(min(1.0, max(share, 1e-3)), 4)])
    return out


def _validation_outcome(suspects: list[str], answers: Mapping[str, Any]) -> ActionOutcome:
    """The validate outcome (the base contract's ``confirmed``, ``ranks``, ``nodes``) from the job's answers."""
    result: dict[str, Any] = {"confirmed": False, "ranks": [], "nodes": [], "cleared_ranks": [], "cleared_nodes": []}
    pause = 0.0
    comp = answers.get("compute")
    if comp is not None:
        result["ranks"], result["cleared_ranks"] = list(comp["confirmed"]), list(comp["cleared"])
        result["compute"] = {k: comp.get(k) for k in ("verdict", "ranks", "peers", "pause_s", "at_iteration")}
        pause += float(comp.get("pause_s") or 0.0)
    links = answers.get("links")
    if links is not None:
        named = {node_name(int(n)) for n in links["nodes"]}
        result["nodes"] = [n for n in suspects if n in named]
        result["cleared_nodes"] = [n for n in suspects if n not in named]
        result["links"] = {k: links.get(k) for k in ("verdict", "links", "rounds", "slow_links", "pause_s",
                                                      "at_iteration")}
        result["paths"] = paths_of_slow_links(links)
        ref = (links.get("verdict") or {}).get("reference_bandwidth_Bps")
        if ref:  # what a healthy link of this cluster carries: the S3 planner's link bandwidth
            result["link_bw_Bps"] = float(ref)
        pause += float(links.get("pause_s") or 0.0)
    result["confirmed"] = bool(result["ranks"] or result["nodes"] or result.get("paths"))
    detail = (f"validation {'confirmed' if result['confirmed'] else 'cleared'} the suspects: slow ranks "
              f"{result['ranks']}, nodes {result['nodes']}, paths {result.get('paths', [])}; cleared ranks "
              f"{result['cleared_ranks']}, "
              f"nodes {result['cleared_nodes']}; pause {pause:.2f} s")
    return ActionOutcome(True, detail, result, pause_s=pause, iterations_lost=0)
