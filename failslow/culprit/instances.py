"""Call instances: the k-th call on a communicator matched across its members (and the k-th send a->b
with the k-th receive at b), and each instance's split into wait and transfer."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.record.calls import RECV, SEND, Calls


@dataclass(frozen=True)
class Instance:
    """One matched call instance: who took part, when each arrived and left."""

    group: tuple[Any, ...]  # group key: ("coll", comm) or ("p2p", comm, src, dst)
    ranks: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    nbytes: int
    op: int

    @property
    def last_arrival(self) -> float:
        """When the last participant entered the call."""
        return max(self.start)

    def transfer(self) -> float:
        """Time from the last arrival to the median exit: what the data movement took.

        For a send/recv pair only the receiver's exit counts: a buffered send returns before the data
        has arrived, sometimes before the receiver even posted its receive.
        """
        la = self.last_arrival
        if self.group[0] == "p2p":
            return max(0.0, self.end[1] - la)
        return float(np.median([e - la for e in self.end]))

    def waits(self) -> tuple[float, ...]:
        """Per participant: time spent waiting for the last arrival (a sender never waits for a receiver)."""
        la = self.last_arrival
        if self.group[0] == "p2p":
            return (0.0, la - self.start[1])
        return tuple(la - s for s in self.start)


def match_instances(calls: Calls) -> list[Instance]:
    """Match calls across ranks into instances (collectives by communicator and order, p2p by pair and order).

    A collective instance is kept only if every member's call is present (a window cut in the middle
    of a call sequence leaves unmatched calls, which are dropped).
    """
    order = np.lexsort((calls.seq, calls.rank))
    members: dict[int, dict[int, int]] = defaultdict(dict)  # comm -> comm_rank -> global rank
    for i in order.tolist():
        if calls.comm_rank[i] >= 0:
            members[int(calls.comm[i])][int(calls.comm_rank[i])] = int(calls.rank[i])
    coll: dict[tuple[int, int], list[int]] = defaultdict(list)  # (comm, rank) -> call indices in order
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)  # (comm, src, dst)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i in order.tolist():
        op, comm, rk = int(calls.op[i]), int(calls.comm[i]), int(calls.rank[i])
        if op in (SEND, RECV):
            peer = members.get(comm, {}).get(int(calls.peer[i]))
            if peer is None:
                continue
            if op == SEND:
                sends[(comm, rk, peer)].append(i)
            else:
                recvs[(comm, peer, rk)].append(i)
        else:
            coll[(comm, rk)].append(i)
    out: list[Instance] = []
    by_comm: dict[int, list[int]] = defaultdict(list)
    for comm, rk in coll:
        by_comm[comm].append(rk)
    for comm, rks in by_comm.items():
        size = int(calls.nranks[coll[(comm, rks[0])][0]])
        if len(rks) < max(size, 2):
            continue  # not every member is visible: cannot tell who waited for whom
        rks.sort()
        lists = [coll[(comm, r)] for r in rks]
        offs = _align([calls.end[np.asarray(li)] for li in lists])
        k_max = min(len(li) - o for li, o in zip(lists, offs, strict=True))
        for k in range(k_max):
            idx = [li[k + o] for li, o in zip(lists, offs, strict=True)]
            out.append(Instance(group=("coll", comm), ranks=tuple(rks),
                                start=tuple(float(calls.start[i]) for i in idx),
                                end=tuple(float(calls.end[i]) for i in idx),
                                nbytes=int(max(calls.nbytes[i] for i in idx)), op=int(calls.op[idx[0]])))
    for key, s_list in sends.items():
        r_list = recvs.get(key, [])
        comm, src, dst = key
        for si, ri in zip(s_list, r_list, strict=False):
            out.append(Instance(group=("p2p", comm, src, dst), ranks=(src, dst),
                                start=(float(calls.start[si]), float(calls.start[ri])),
                                end=(float(calls.end[si]), float(calls.end[ri])),
                                nbytes=int(calls.nbytes[si]), op=SEND))
    return out


def _align(ends: list[NDArray[np.float64]], max_shift: int = 3) -> list[int]:
    """Per member of a communicator, how many of its first calls to skip so the k-th calls are one instance.

    A window cut between a fast member's call and a slow member's call of the same instance leaves the
    slow member one call ahead in the window; matching by position would then pair every call with the
    next instance's and make the fast member look like the last to arrive. Every member leaves a
    collective at about the same time (when the data is complete), so the shift that lines up exit
    times is the right one.
    """
    ref = ends[0]
    shifts = [0]
    for e in ends[1:]:
        best, best_cost = 0, float("inf")
        for d in sorted(range(-max_shift, max_shift + 1), key=abs):
            lo, hi = max(0, -d), min(ref.shape[0], e.shape[0] - d)
            if hi - lo < 1:
                continue
            cost = float(np.median(np.abs(e[lo + d:hi + d] - ref[lo:hi])))
            if cost < best_cost * 0.5 or (best_cost == float("inf")):
                best, best_cost = d, cost
        shifts.append(best)
    low = min(shifts)
    return [d - low for d in shifts]
