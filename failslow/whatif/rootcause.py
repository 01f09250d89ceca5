"""Root-cause verdict for a what-if result: which recognised cause explains the slowdown, with evidence.

Causes (the patterns of the what-if study's DP x PP heatmaps and op-type decompositions):

* ``stage_partitioning_imbalance`` - one pipeline stage is slow on every DP rank (its compute per
  micro-batch is well above the other stages'), so S_stage of that stage explains the slowdown.
* ``individual_worker`` - one worker (DP rank x stage) is slow while the other DP ranks of its stage
  are not; its S_w explains the slowdown.
* ``sequence_length_imbalance`` - micro-batches differ in length: a micro-batch's forward and backward
  compute times rise and fall together (their correlation, after removing stage and worker effects,
  is high) and compute op types explain the slowdown.
* ``gc_pauses`` - garbage-collection pauses (the `gc` op type) explain the slowdown.
* ``none`` - the job is within `NONE_BELOW` of its ideal, or no recognised cause explains at least
  `MIN_SHARE` of the slowdown.

Each candidate's score is the share of the slowdown (S - 1) its decomposition explains; the verdict
is the best-scoring candidate whose pattern test passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.whatif import trace as tr
from failslow.whatif.model import Model

FloatArray = npt.NDArray[np.float64]

NONE_BELOW = 0.02  # S below 1.02: nothing worth a verdict
MIN_SHARE = 0.3  # a cause must explain at least this share of S - 1
IMBALANCE = 1.1  # a slow stage/worker computes at least 10% longer than its peers
SEQ_CORR = 0.5  # forward/backward correlation that signals varying sequence lengths
SEQ_CV = 0.05  # and their spread (coefficient of variation) must be at least this


@dataclass(frozen=True)
class RootCause:
    """The verdict and the numbers behind it."""

    verdict: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    candidates: dict[str, float] = field(default_factory=dict)  # cause -> share of slowdown explained

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"verdict": self.verdict, "summary": self.summary, "evidence": self.evidence,
                "candidates": self.candidates}


def _r(x: float) -> float:
    return float(round(float(x), 4))


def compute_stats(m: Model) -> dict[str, Any]:
    """Per-worker compute means and the forward/backward micro-batch correlation of a trace."""
    dp, pp = m.dp, int(m.trace.meta.pp_size)
    comp = (m.optype == tr.FWD) | (m.optype == tr.BWD)
    resid: dict[int, FloatArray] = {}
    worker_mean = np.zeros((dp, pp))  # mean compute op duration of each worker
    for p in range(pp):
        on = comp & (m.stage == p)
        if on.any():
            worker_mean[:, p] = m.work[on].mean(axis=(0, 2))
        for o in (tr.FWD, tr.BWD):
            nodes = np.flatnonzero(on & (m.optype == o))
            if nodes.size == 0:
                continue
            # relative to the worker's own mean for this op type: what is left varies per step and
            # micro-batch (stage and persistent worker effects removed)
            x = m.work[nodes]
            x = x / np.maximum(x.mean(axis=(0, 2), keepdims=True), 1e-12)
            for j, v in enumerate(nodes.tolist()):
                resid[v] = x[j]
    # forward/backward pairs of the same micro-batch and model chunk
    fb = []
    fwd = {(int(m.stage[v]), int(m.gmc[v]), int(m.mb[v])): v for v in np.flatnonzero(m.optype == tr.FWD).tolist()}
    for v in np.flatnonzero(m.optype == tr.BWD).tolist():
        key = (int(m.stage[v]), int(m.gmc[v]), int(m.mb[v]))
        if key in fwd and key[2] >= 0 and v in resid and fwd[key] in resid:
            fb.append((resid[fwd[key]].reshape(-1), resid[v].reshape(-1)))
    corr, cv = 0.0, 0.0
    if fb:
        f = np.concatenate([a for a, _ in fb])
        b = np.concatenate([c for _, c in fb])
        if f.size > 2 and f.std() > 0 and b.std() > 0:
            corr = float(np.corrcoef(f, b)[0, 1])
        cv = float(f.std())
    gc = m.optype == tr.GC
    gc_work = m.work[gc] if gc.any() else np.zeros((0, dp, m.n_steps))
    return {"worker_mean": worker_mean, "fb_corr": corr, "fwd_cv": cv,
            "gc_mean_s": float(gc_work.mean()) if gc_work.size else 0.0,
            "gc_max_s": float(gc_work.max()) if gc_work.size else 0.0,
            "gc_nonzero_frac": float((gc_work > 0).mean()) if gc_work.size else 0.0}


def diagnose(m: Model, *, S: float, S_t: dict[str, float], S_stage: dict[int, float], S_dp: dict[int, float],
             S_w: FloatArray, M_W: float | None, M_S: float | None) -> RootCause:
    """Pick the recognised cause that best explains the slowdown (see the module docstring)."""
    dp, pp = S_w.shape
    if S < 1.0 + NONE_BELOW:
        return RootCause("none", f"no significant straggling: S = {S:.3f} (< {1 + NONE_BELOW:g})",
                         {"S": _r(S)})
    st = compute_stats(m)
    gap = S - 1.0

    def share(x: float) -> float:
        return _r((x - 1.0) / gap)

    cands: dict[str, float] = {}
    ev: dict[str, dict[str, Any]] = {}
    wm = st["worker_mean"]

    # stage partitioning: the stage with the largest S_stage, slow on all its DP ranks
    p_star = max(S_stage, key=lambda p: S_stage[p])
    sm = wm.mean(axis=0)
    others = np.delete(sm, p_star)
    imb = float(sm[p_star] / np.median(others)) if others.size and np.median(others) > 0 else 1.0
    spread = float(wm[:, p_star].max() / max(wm[:, p_star].min(), 1e-12)) if dp > 1 else 1.0
    ev["stage_partitioning_imbalance"] = {
        "stage": int(p_star), "S_stage": _r(S_stage[p_star]), "M_S": None if M_S is None else _r(M_S),
        "compute_per_op_vs_other_stages": _r(imb), "spread_across_dp_ranks": _r(spread),
        "stage_compute_mean_s": [_r(x) for x in sm]}
    if pp > 1 and imb >= IMBALANCE and spread < imb:
        cands["stage_partitioning_imbalance"] = share(S_stage[p_star])

    # individual worker: the worker with the largest S_w, slow against its stage's other DP ranks
    d_w, p_w = np.unravel_index(int(np.argmax(S_w)), S_w.shape)
    peers = np.delete(wm[:, p_w], d_w)
    rel = float(wm[d_w, p_w] / np.median(peers)) if peers.size and np.median(peers) > 0 else 1.0
    peer_sw = np.delete(S_w[:, p_w], d_w)
    sw_excess = float(S_w[d_w, p_w] - (np.median(peer_sw) if peer_sw.size else 1.0))
    ev["individual_worker"] = {
        "dp_rank": int(d_w), "pp_rank": int(p_w), "S_w": _r(S_w[d_w, p_w]),
        "compute_vs_stage_peers": _r(rel), "S_w_above_stage_peers": _r(sw_excess),
        "M_W": None if M_W is None else _r(M_W)}
    if dp > 1 and (rel >= IMBALANCE or sw_excess >= 0.5 * gap):
        cands["individual_worker"] = share(S_w[d_w, p_w])

    # sequence-length imbalance
    comp_share = share(S_t.get("forward-compute", 1.0) + S_t.get("backward-compute", 1.0) - 1.0)
    ev["sequence_length_imbalance"] = {
        "forward_backward_correlation": _r(st["fb_corr"]), "forward_cv": _r(st["fwd_cv"]),
        "S_forward_compute": _r(S_t.get("forward-compute", 1.0)),
        "S_backward_compute": _r(S_t.get("backward-compute", 1.0))}
    if st["fb_corr"] >= SEQ_CORR and st["fwd_cv"] >= SEQ_CV:
        cands["sequence_length_imbalance"] = _r(comp_share * min(1.0, st["fb_corr"]))

    # GC pauses
    s_gc = S_t.get("gc", 1.0)
    ev["gc_pauses"] = {"S_gc": _r(s_gc), "gc_mean_s": _r(st["gc_mean_s"]), "gc_max_s": _r(st["gc_max_s"]),
                       "fraction_of_worker_steps_with_gc": _r(st["gc_nonzero_frac"])}
    if s_gc > 1.0:
        cands["gc_pauses"] = share(s_gc)

    ok = {c: s for c, s in cands.items() if s >= MIN_SHARE}
    if not ok:
        return RootCause("none", f"S = {S:.3f}, but no recognised cause explains {MIN_SHARE:.0%} of it",
                         {"S": _r(S), **{k: v for k, v in ev.items()}}, cands)
    best = max(ok, key=lambda c: ok[c])
    e = ev[best]
    if best == "stage_partitioning_imbalance":
        summary = (f"stage {e['stage']} computes {e['compute_per_op_vs_other_stages']:.2f}x the other stages "
                   f"on every DP rank; alone it slows the job by {e['S_stage']:.3f}x")
    elif best == "individual_worker":
        summary = (f"worker dp_rank={e['dp_rank']} pp_rank={e['pp_rank']} alone slows the job by "
                   f"{e['S_w']:.3f}x (compute {e['compute_vs_stage_peers']:.2f}x its stage peers)")
    elif best == "sequence_length_imbalance":
        summary = (f"micro-batch compute varies (cv {e['forward_cv']:.2f}) with forward/backward correlation "
                   f"{e['forward_backward_correlation']:.2f}: uneven sequence lengths")
    else:
        summary = f"GC pauses (max {e['gc_max_s']:.3g} s) alone slow the job by {e['S_gc']:.3f}x"
    return RootCause(best, summary, {"S": _r(S), **e}, cands)
