"""The ski-rental planner, transition by transition, and two whole events run tick by tick."""

from __future__ import annotations

from dataclasses import replace

import pytest

from failslow.errors import InputError
from failslow.plan.pace import RankCompute, fit
from failslow.plan.policy import (
    LEVEL,
    Costs,
    EventView,
    JobView,
    PastAction,
    Policy,
    Suspect,
    TopologyOption,
    accrue,
    bad_nodes,
    decide,
    judge,
    ladder,
    recovered,
    restore,
    signature,
)

ALL = frozenset({"validate", "rebalance", "topology", "restart"})
COSTS = Costs(validate=10, rebalance=2, topology=90, restart=120)


def model(slow: float = 3.0, counts: tuple[int, ...] = (4, 4)):  # DP2 x PP2, rank 1 (dp 1, pp 0) slowed
    per_mb = {(0, 0): 0.1, (0, 1): 0.1, (1, 0): 0.1 * slow, (1, 1): 0.1}
    ranks = [RankCompute(r, d, p, per_mb[d, p] * counts[d]) for r, (d, p) in enumerate(per_mb)]
    pace = max((counts[d] - 1) * max(per_mb[d, 0], per_mb[d, 1]) + per_mb[d, 0] + per_mb[d, 1] for d in (0, 1)) + 0.05
    return fit(ranks, counts, pace), pace


def job(now: float = 1000.0, **kw) -> JobView:
    m, pace = model()
    base = {"now": now, "pace_s": pace, "healthy_s": 0.55, "model": m, "microbatches": (4, 4),
            "placement": (0, 1, 2, 3), "nodes": ("n0", "n1", "n2", "n3"), "capabilities": ALL}
    return JobView(**{**base, **kw})


def event(**kw) -> EventView:
    # onset 1000 s before `job()`'s now: expected to last about as long again, so expensive actions can pay
    base = {"job": "llm", "onset_ts": 0.0, "suspects": (Suspect("compute", 1, "n1"),), "lost_s": 50.0}
    return EventView(**{**base, **kw})


def test_compute_suspect_rebalances_first_with_the_exact_split_and_a_prediction() -> None:
    d = decide(event(), job(), COSTS, Policy())
    assert d.strategy == "rebalance" and not d.needs_approval and d.level == 2
    assert d.chosen is not None and sum(d.chosen.params["counts"]) == 8
    assert d.chosen.params["counts"][1] < 4 < d.chosen.params["counts"][0]  # the slow replica gets fewer
    assert d.chosen.predicted_s is not None and d.chosen.predicted_s < job().pace_s
    assert d.chosen.saving_s is not None and d.chosen.saving_s > d.chosen.cost_s


@pytest.mark.parametrize("actions, firing, why", [
    ((PastAction("rebalance", "running"),), True, "in flight"),
    ((PastAction("restart", "pending_approval"),), True, "in flight"),
    ((), False, "alert resolved"),
    ((PastAction("rebalance", "succeeded", ended_at=990.0, effective=True),), True, "cooldown"),
])
def test_rules_that_make_the_planner_wait(actions, firing, why) -> None:
    d = decide(event(actions=actions, firing=firing), job(), COSTS, Policy())
    assert d.strategy == "ignore" and d.wait and why in d.reason


def test_after_the_cooldown_the_planner_waits_until_the_pace_shows_the_last_action() -> None:
    # the cooldown has passed, but the readings still hold iterations from before the split: no new action,
    # not even the way back once the alert resolved; with no action ended, a settling note means nothing
    done = (PastAction("rebalance", "succeeded", ended_at=900.0, effective=None, params={"counts": [5, 3]}),)
    jv = job(settling="9 of 21 iterations reported since the last action")
    d = decide(event(actions=done), jv, COSTS, Policy())
    assert d.strategy == "ignore" and d.wait and d.reason == "settling: 9 of 21 iterations reported since the last action"
    even, pace = model(slow=1.0, counts=(6, 2))
    back = job(model=even, pace_s=pace, microbatches=(6, 2), default_microbatches=(4, 4))
    assert decide(event(actions=done, firing=False), back, COSTS, Policy()).strategy == "rebalance"
    held = decide(event(actions=done, firing=False), replace(back, settling="3 of 21 iterations"), COSTS, Policy())
    assert held.strategy == "ignore" and held.reason == "alert resolved: no new action"
    assert decide(event(), jv, COSTS, Policy()).strategy == "rebalance"
    assert "settling" not in decide(event(actions=done), replace(jv, settling=None), COSTS, Policy()).reason


def test_dry_run_plans_and_validation_do_not_block_or_cool_down() -> None:
    # a dry-run plan is not in flight, and after validation there is nothing to wait for
    d = decide(event(actions=(PastAction("topology", "planned", dry_run=True),
                              PastAction("validate", "succeeded", ended_at=999.0)), validated=True), job(), COSTS,
               Policy())
    assert d.strategy == "rebalance"


def test_cap_per_hour() -> None:
    d = decide(event(), job(actions_last_hour=4), COSTS, Policy(max_actions_per_hour=4))
    assert d.strategy == "ignore" and d.wait and "cap" in d.reason
    assert decide(event(), job(actions_last_hour=3), COSTS, Policy(max_actions_per_hour=4)).strategy == "rebalance"


def test_ski_rental_waits_until_the_slowdown_paid_the_strategys_price() -> None:
    d = decide(event(lost_s=1.0), job(), COSTS, Policy())
    assert d.strategy == "ignore" and not d.wait and "accumulated slowdown 1.0 s < cost 2.0 s" in d.reason
    assert decide(event(lost_s=2.0), job(), COSTS, Policy()).strategy == "rebalance"


def test_prediction_gate_too_little_gain_goes_to_the_next_rung() -> None:
    # the job runs at 1.0 s instead of 0.55 s, but its replicas are within 2 %: no split is worth it
    m, _ = model(slow=1.02)
    m = fit([RankCompute(r, r // 2, r % 2, x) for r, x in enumerate(m.per_mb.ravel() * 4)], (4, 4), 1.0)
    d = decide(event(lost_s=500.0), job(model=m, pace_s=1.0), COSTS, Policy())
    reb = next(c for c in d.considered if c.strategy == "rebalance")
    assert not reb.ok
    assert "gain" in reb.why or "already optimal" in reb.why
    assert d.strategy in ("validate", "restart")  # a long event: the expensive rungs pay (validated first)


def test_prediction_gate_saving_must_beat_the_cost_over_the_expected_remaining_time() -> None:
    # rebalance costs a lot here; a young event (remaining time estimated = its age, at least 60 s) does
    # not save enough, an old one does
    costs = replace(COSTS, rebalance=30.0)
    young = decide(event(lost_s=40.0, onset_ts=990.0), job(), costs, Policy(horizon_min_s=10.0))
    reb = next(c for c in young.considered if c.strategy == "rebalance")
    assert not reb.ok and "<= cost" in reb.why
    old = decide(event(lost_s=40.0, onset_ts=0.0), job(), costs, Policy(horizon_min_s=10.0))
    assert old.strategy == "rebalance"


def test_link_suspect_goes_to_topology_then_restart() -> None:
    ev = event(suspects=(Suspect("link", None, "n2"),), lost_s=100.0, validated=True)
    topo = (TopologyOption((0, 1, 3, 2), 0.6, "swap n2 and n3"),)
    d = decide(ev, job(topology=topo), COSTS, Policy())
    assert d.strategy == "topology" and d.chosen is not None and d.chosen.params["placement"] == [0, 1, 3, 2]
    assert "rebalance" not in {c.strategy for c in d.considered}
    # without a better placement: restart once its price is paid, excluding the link's node
    d = decide(replace(ev, lost_s=130.0), job(), COSTS, Policy())
    assert d.strategy == "restart" and d.needs_approval and d.chosen.params["exclude_nodes"] == ["n2"]
    assert d.chosen.predicted_s == job().healthy_s


def test_no_suspect_only_rebalances() -> None:
    assert ladder(()) == ("rebalance",)
    assert ladder((Suspect("compute", 1), Suspect("link", None, "n1"))) == ("topology", "restart")
    d = decide(event(suspects=(), lost_s=1e4), job(), COSTS, Policy())
    assert d.strategy == "rebalance"


def test_only_what_the_adapter_supports() -> None:
    d = decide(event(lost_s=1e4), job(capabilities=frozenset({"restart"})), COSTS, Policy(validate_before=frozenset()))
    assert d.strategy == "restart"
    assert any(c.strategy == "rebalance" and "not supported" in c.why for c in d.considered)
    d = decide(event(lost_s=1e4), job(capabilities=frozenset()), COSTS, Policy())
    assert d.strategy == "ignore"


def test_the_same_action_is_not_taken_again_after_it_did_not_help() -> None:
    first = decide(event(), job(), COSTS, Policy())
    key = signature("rebalance", first.chosen.params)
    d = decide(event(lost_s=60.0), job(ineffective=frozenset({key})), COSTS, Policy(validate_before=frozenset()))
    assert d.strategy == "ignore"  # the split did not help; restart's price (120 s) not paid yet
    assert any("did not help" in c.why for c in d.considered)
    # in the event itself too, by what the action changed: another split would still be allowed
    past = PastAction("rebalance", "succeeded", ended_at=800.0, effective=False, params=first.chosen.params)
    d = decide(event(actions=(past,), lost_s=60.0), job(), COSTS, Policy())
    assert d.strategy == "ignore" and any("did not help" in c.why for c in d.considered)
    other = replace(past, params={"counts": [5, 3]})
    assert decide(event(actions=(other,)), job(), COSTS, Policy(retune_gain=0.0)).strategy == "rebalance"


def test_retuning_an_applied_split_needs_a_larger_gain() -> None:
    past = PastAction("rebalance", "succeeded", ended_at=800.0, effective=True, params={"counts": [5, 3]})
    m, pace = model(counts=(5, 3))  # the 5/3 split in place; the exact one is 6/2, a small further gain
    jv = job(model=m, pace_s=pace, microbatches=(5, 3))
    strict = decide(event(actions=(past,)), jv, COSTS, Policy(retune_gain=0.5))
    assert strict.strategy != "rebalance"
    assert any("re-tuning gain" in c.why for c in strict.considered)
    assert decide(event(actions=(past,)), jv, COSTS, Policy(retune_gain=0.0)).strategy == "rebalance"


def test_a_resolved_alert_with_the_events_split_in_place_goes_back_to_the_jobs_own_split() -> None:
    # [6, 2] was applied for replica 1; the straggler recovered and the alert resolved with the pace still
    # above healthy because of the split: back to [4, 4], after the cooldown, and only while it pays
    split = PastAction("rebalance", "succeeded", ended_at=800.0, effective=True, params={"counts": [6, 2]})
    even, pace = model(slow=1.0, counts=(6, 2))
    jv = job(model=even, pace_s=pace, microbatches=(6, 2), default_microbatches=(4, 4))
    d = decide(event(actions=(split,), firing=False), jv, COSTS, Policy())
    assert d.strategy == "rebalance" and d.chosen is not None and d.level == 2
    assert d.chosen.params == {"counts": [4, 4], "from": [6, 2], "restore": True}
    assert d.chosen.predicted_s is not None and d.chosen.predicted_s < pace and "alert resolved" in d.reason
    waiting = [
        (event(actions=(replace(split, ended_at=990.0),), firing=False), jv),  # cooldown
        (event(actions=(split,), firing=False), replace(jv, actions_last_hour=4)),  # cap
        (event(actions=(split,), firing=False), replace(jv, default_microbatches=None)),  # the job's own split
        (event(actions=(split,), firing=False), replace(jv, capabilities=ALL - {"rebalance"})),
        (event(actions=(split,), firing=False), replace(jv, ineffective=frozenset({signature("rebalance", {"counts": [4, 4]})}))),
    ]
    for ev, jv2 in waiting:
        w = decide(ev, jv2, COSTS, Policy())
        assert w.strategy == "ignore" and w.reason == "alert resolved: no new action", (jv2, w)
    slow, slow_pace = model(slow=3.0, counts=(6, 2))  # the straggler still slow: the split stays
    still = decide(event(actions=(split,), firing=False),
                   replace(jv, model=slow, pace_s=slow_pace), COSTS, Policy())
    assert still.strategy == "ignore" and still.reason == "alert resolved: no new action"


def test_a_split_that_made_the_job_slower_is_undone_and_no_other_split_is_planned() -> None:
    # the model says replica 1 is slow; [6, 2] was applied and the job went from 0.80 s to 0.92 s
    harmful = PastAction("rebalance", "succeeded", ended_at=800.0, effective=False,
                         params={"counts": [6, 2], "from": [4, 4]}, pace_before_s=0.80, pace_after_s=0.92)
    m, _ = model(counts=(6, 2))
    jv = job(model=m, pace_s=0.92, microbatches=(6, 2))
    d = decide(event(actions=(harmful,)), jv, COSTS, Policy())
    assert d.strategy == "rebalance" and d.chosen is not None
    assert d.chosen.params == {"counts": [4, 4], "from": [6, 2], "undo": True}
    assert d.chosen.predicted_s == 0.80 and "left the job slower" in d.chosen.why  # the pace measured under it
    # once back, S2 plans nothing on the same times: the ladder goes on (topology has no placement here)
    back = PastAction("rebalance", "succeeded", ended_at=900.0, effective=True,
                      params={"counts": [4, 4], "from": [6, 2], "undo": True}, pace_before_s=0.92, pace_after_s=0.80)
    d = decide(event(actions=(harmful, back), lost_s=60.0), job(pace_s=0.80), COSTS, Policy())
    assert d.strategy != "rebalance"
    assert any(c.strategy == "rebalance" and "no longer in place" in c.why for c in d.considered)
    # a split that helped, or one that did not help but did no harm, leaves S2 planning as before
    mild = replace(harmful, pace_after_s=0.82)
    assert _harmless(decide(event(actions=(mild,)), jv, COSTS, Policy(retune_gain=0.0)))
    # and a move since makes a new job for the model
    moved = PastAction("topology", "succeeded", ended_at=850.0, params={"placement": [0, 1, 3, 2]})
    assert _harmless(decide(event(actions=(harmful, moved)), jv, COSTS, Policy(retune_gain=0.0)))


def _harmless(d) -> bool:
    return not (d.chosen is not None and d.chosen.params.get("undo")) and \
        not any("left the job slower" in c.why for c in d.considered)


def test_dry_run_plans_walk_the_ladder() -> None:
    ev = event(lost_s=500.0, actions=(PastAction("rebalance", "planned", dry_run=True),), validated=True)
    d = decide(ev, job(), COSTS, Policy())
    assert d.strategy == "restart"  # rebalance already planned in this event; topology has no placement


def test_validation_before_an_expensive_strategy() -> None:
    ev = event(suspects=(Suspect("link", None, "n2"),), lost_s=500.0)
    d = decide(ev, job(), COSTS, Policy())
    assert d.strategy == "validate" and d.chosen.params == {"ranks": [], "nodes": ["n2"]}
    assert LEVEL["validate"] == 1
    assert decide(replace(ev, validated=True), job(), COSTS, Policy()).strategy == "restart"
    cleared = decide(replace(ev, validated=False), job(), COSTS, Policy())
    assert cleared.strategy == "ignore" and any("cleared" in c.why for c in cleared.considered)
    # an adapter that cannot validate: straight to the strategy
    assert decide(ev, job(capabilities=frozenset({"restart"})), COSTS, Policy()).strategy == "restart"
    # a failed validation leaves no verdict: validating again is the way to get one
    failed = replace(ev, actions=(PastAction("validate", "failed", ended_at=50.0),))
    assert decide(failed, job(), COSTS, Policy()).strategy == "validate"


def test_a_verdict_covers_the_suspects_it_measured_only() -> None:
    from failslow.plan.policy import validation_targets, verdict_for

    link = (Suspect("link", None, "n0"), Suspect("link", None, "n1"))
    checked = validation_targets(link)
    assert checked == {"ranks": [], "nodes": ["n0", "n1"]}
    assert verdict_for(False, checked, link) is False and verdict_for(True, checked, link[:1]) is True
    # the detector now names a rank the link validation never benchmarked: validate again
    assert verdict_for(False, checked, (*link, Suspect("compute", 6))) is None
    assert verdict_for(True, None, (Suspect("compute", 6),)) is True  # targets unknown: the verdict stands
    assert verdict_for(None, checked, link) is None


def test_a_restart_does_not_exclude_the_nodes_a_validation_cleared() -> None:
    link = (Suspect("link", None, "n1"), Suspect("link", None, "n2"))
    ev = event(suspects=link, lost_s=500.0, validated=True)
    d = decide(ev, job(), COSTS, Policy(approval=frozenset()))
    assert d.strategy == "restart" and d.chosen.params["exclude_nodes"] == ["n1", "n2"]
    # a congested path n1-n2: both NICs measured healthy, nothing for a restart to exclude
    both = decide(replace(ev, cleared=frozenset({"n1", "n2"})), job(), COSTS, Policy(approval=frozenset()))
    assert both.strategy == "ignore" and any("validation cleared" in c.why for c in both.considered)
    one = decide(replace(ev, cleared=frozenset({"n2"})), job(), COSTS, Policy(approval=frozenset()))
    assert one.strategy == "restart" and one.chosen.params["exclude_nodes"] == ["n1"]


def test_a_restart_without_a_free_spare_for_each_node_predicts_nothing() -> None:
    """Off the bad nodes onto spares the job runs at its healthy pace; with fewer free spares than nodes to
    leave, the ranks left over crowd the healthy nodes (or the job shrinks), so that pace is not the prediction
    and the planner does not restart. A person may still ask for the restart."""
    link = (Suspect("link", None, "n1"), Suspect("link", None, "n2"))
    ev = event(suspects=link, lost_s=500.0, validated=True)
    pol = Policy(approval=frozenset())
    for spares in (None, 2, 3):  # unknown (a scheduler finds nodes) or enough
        d = decide(ev, job(spares=spares), COSTS, pol)
        assert d.strategy == "restart" and d.chosen is not None and d.chosen.predicted_s == 0.55, spares
    for spares in (0, 1):
        d = decide(ev, job(spares=spares), COSTS, pol)
        assert d.strategy == "ignore", (spares, d)
        (c,) = [c for c in d.considered if c.strategy == "restart"]
        assert c.predicted_s is None and f"2 node(s) to leave but {spares} free spare(s)" in c.why
        forced = decide(ev, job(spares=spares), COSTS, pol, force="restart")
        assert forced.strategy == "restart" and forced.chosen.params["exclude_nodes"] == ["n1", "n2"]
    # a suspect node that holds no rank any more needs no spare
    idle = decide(ev, job(spares=1, placement=(0, 3, 2, 3)), COSTS, pol)
    assert idle.strategy == "restart" and idle.chosen is not None and idle.chosen.params["exclude_nodes"] == ["n1", "n2"]


def test_an_unmeasured_link_suspect_is_validated_when_nothing_else_can_be_planned() -> None:
    """Both ends of one congested path are named; one spare cannot take both, and the topology planner found no
    move on the detector's guess. The validation measures which path and how much is left: it comes first."""
    link = (Suspect("link", None, "n1"), Suspect("link", None, "n2"))
    pol = Policy(approval=frozenset())
    ev = event(suspects=link, lost_s=50.0)
    d = decide(ev, job(spares=1), COSTS, pol)
    assert d.strategy == "validate" and d.chosen is not None and d.chosen.params == {"ranks": [], "nodes": ["n1", "n2"]}
    assert "measure the suspect links" in d.reason
    assert any(c.strategy == "restart" and "1 free spare" in c.why for c in d.considered)
    # ski rental: not before the slowdown accumulated reaches the validation's cost
    assert decide(replace(ev, lost_s=5.0), job(spares=1), COSTS, pol).strategy == "ignore"
    # measured already (and not moved since), or no way to measure, or no link named: nothing to add
    assert decide(replace(ev, validated=True), job(spares=1), COSTS, pol).strategy == "ignore"
    assert decide(replace(ev, validated=False), job(spares=1), COSTS, pol).strategy == "ignore"
    no_validate = job(spares=1, capabilities=frozenset({"rebalance", "topology", "restart"}))
    assert decide(ev, no_validate, COSTS, pol).strategy == "ignore"
    compute = event(suspects=(Suspect("compute", 1, "n1"),), lost_s=50.0)
    assert decide(compute, job(model=None, spares=0), COSTS, pol).strategy == "ignore"


def test_a_restart_after_a_rebalance_resumes_with_the_jobs_own_split() -> None:
    """The split that worked around the slow node would hold the healthy replica back once it is gone."""
    ev = event(suspects=(Suspect("compute", 1, "n1"),), lost_s=500.0, validated=True,
               actions=(PastAction("rebalance", "succeeded", ended_at=100.0),))
    pol = Policy(approval=frozenset())
    moved = decide(ev, job(microbatches=(6, 2), default_microbatches=(4, 4)), COSTS, pol, force="restart")
    assert moved.strategy == "restart" and moved.chosen is not None
    assert moved.chosen.params["exclude_nodes"] == ["n1"]
    assert moved.chosen.params["counts"] == [4, 4] and moved.chosen.params["from"] == [6, 2]
    # never changed (or back already): nothing to put back
    for kw in ({"microbatches": (4, 4)}, {"microbatches": (4, 4), "default_microbatches": (4, 4)}):
        plain = decide(ev, job(**kw), COSTS, pol, force="restart")
        assert plain.chosen is not None and "counts" not in plain.chosen.params


def test_a_verdict_from_before_a_move_does_not_license_another_restart() -> None:
    """After an S4 the suspect rank runs on the spare: the event still names it, so the restart candidate now
    excludes the spare. The validation that licensed the first restart measured the old placement; the
    planner must measure again before a second one (the compound run restarted twice without this)."""
    pol = Policy(approval=frozenset())
    validated = PastAction("validate", "succeeded", ended_at=100.0, params={"ranks": [1], "nodes": []})
    restarted = PastAction("restart", "succeeded", ended_at=200.0, params={"exclude_nodes": ["n1"]})
    on_spare = job(now=1300.0, placement=(0, 4, 2, 3), nodes=("n0", "n1", "n2", "n3", "n4"), pace_s=0.62)
    ev = event(lost_s=800.0, validated=True, actions=(validated, restarted))
    d = decide(ev, on_spare, COSTS, pol)
    assert d.strategy == "validate" and d.chosen is not None and d.chosen.params["ranks"] == [1]
    # a validation after the move that finds the rank healthy on the spare: no second restart
    cleared = replace(ev, validated=False, actions=(validated, restarted, replace(validated, ended_at=260.0)))
    after = decide(cleared, on_spare, COSTS, pol)
    assert after.strategy != "restart"
    # one that finds it still slow there: the restart may go ahead, off the spare
    again = decide(replace(cleared, validated=True), on_spare, COSTS, pol)
    assert again.strategy == "restart" and again.chosen is not None and again.chosen.params["exclude_nodes"] == ["n4"]
    # without the move in between, the earlier verdict stands
    assert decide(replace(ev, actions=(validated,)), job(), COSTS, pol).strategy != "validate"


def test_rejected_strategy_is_not_planned_again_in_the_event() -> None:
    ev = event(suspects=(Suspect("link", None, "n2"),), lost_s=500.0, validated=True,
               actions=(PastAction("restart", "rejected", ended_at=100.0),))
    assert decide(ev, job(), COSTS, Policy()).strategy == "ignore"


def test_a_person_can_force_the_planners_choice_or_one_strategy() -> None:
    ev = event(lost_s=0.0, firing=False)
    assert decide(ev, job(), COSTS, Policy()).strategy == "ignore"
    auto = decide(ev, job(), COSTS, Policy(), force="auto")
    assert auto.strategy == "rebalance"  # no ski-rental wait, but still the gate
    forced = decide(ev, job(), COSTS, Policy(), force="restart")
    assert forced.strategy == "restart" and forced.needs_approval and forced.reason.startswith("requested")
    assert decide(ev, job(capabilities=frozenset({"rebalance"})), COSTS, Policy(), force="restart").strategy == "ignore"
    with pytest.raises(InputError):
        decide(ev, job(), COSTS, Policy(), force="reboot")


def test_accrue_judge_recovered_restore_and_nodes() -> None:
    assert accrue(0.0, 0.0, 10.0, 2.0, 1.0) == pytest.approx(5.0)  # half of every second is lost at 2x
    assert accrue(3.0, 0.0, 10.0, None, 1.0) == 3.0
    assert accrue(3.0, 0.0, 10.0, 0.9, 1.0) == 3.0  # faster than healthy loses nothing
    eff, why = judge(2.0, 1.1, 1.0, Policy())
    assert eff and "effective" in why
    eff, why = judge(2.0, 1.9, 1.0, Policy())  # took back 0.1 of the predicted 1.0
    assert not eff and "ineffective" in why
    assert recovered(1.05, 1.0, Policy()) and not recovered(1.2, 1.0, Policy()) and not recovered(None, 1.0, Policy())
    even, _ = model(slow=1.0, counts=(6, 2))
    cand = restore(JobView(now=0, pace_s=even.iteration_s, model=even, microbatches=(6, 2)), (4, 4), Policy())
    assert cand is not None and cand.params["counts"] == [4, 4] and cand.params["restore"]
    slow, _ = model(slow=3.0, counts=(6, 2))  # still slow: the uneven split stays
    assert restore(JobView(now=0, pace_s=slow.iteration_s, model=slow, microbatches=(6, 2)), (4, 4), Policy()) is None
    assert bad_nodes((Suspect("compute", 2, "x"), Suspect("link", None, "n9")), (0, 1, 2, 3), ("a", "b", "c", "d")) == ["c", "n9"]


def test_costs_come_from_the_most_specific_source_that_has_one() -> None:
    # a person's config set restart (and validate, to the default's own value); the adapter expects
    # restart, topology and validate from what it measured of the job; rebalance was measured on the cluster
    configured = Costs(restart=30.0, validate=10.0)
    got = configured.layered({"restart", "validate"}, {"restart": 1.0, "topology": 0.7, "validate": 0.8},
                             {"rebalance": 0.0})
    assert got == Costs(validate=10.0, rebalance=0.0, topology=0.7, restart=30.0)
    # nothing expected, nothing measured: the config over the built-in defaults
    assert configured.layered({"restart"}, {}, {}) == Costs(restart=30.0)
    # a measurement beats the config and the adapter's estimate alike
    assert configured.layered({"restart"}, {"restart": 1.0}, {"restart": 2.5}).restart == 2.5


def test_policy_and_costs_refuse_nonsense() -> None:
    with pytest.raises(InputError):
        Policy(min_gain=1.5)
    with pytest.raises(InputError):
        Policy(approval=frozenset({"reboot"}))
    with pytest.raises(InputError):
        Policy(recovered_ratio=0.5)
    assert Costs().with_measured({"restart": 30.0, "nonsense": 1.0, "rebalance": float("nan")}).restart == 30.0
    with pytest.raises(InputError):
        Costs().of("reboot")


def _run(ev: EventView, jv: JobView, seconds: float, effect, policy: Policy, step: float = 5.0):
    """Tick the planner for `seconds`: accrue the slowdown, decide, apply what `effect` says an action does."""
    decisions = []
    t = jv.now
    pace = jv.pace_s
    for _ in range(int(seconds / step)):
        t += step
        lost = accrue(ev.lost_s, t - step, t, pace, jv.healthy_s)
        ev = replace(ev, lost_s=lost)
        jv = replace(jv, now=t, pace_s=pace)
        d = decide(ev, jv, COSTS, policy)
        decisions.append(d)
        if d.strategy != "ignore":
            pace, eff = effect(d, pace)
            ev = replace(ev, actions=(*ev.actions, PastAction(d.strategy, "succeeded", ended_at=t, effective=eff,
                                                                params=d.chosen.params)))
            if d.strategy == "validate":
                ev = replace(ev, validated=True)
    return decisions, ev


def test_a_short_event_stays_at_s1() -> None:
    # a 2x job-wide slowdown for 90 s with no per-rank model (nothing to rebalance with): restart's price
    # (120 s of lost progress) is never paid
    jv = job(now=1000.0, pace_s=1.1, healthy_s=0.55, model=None)
    decisions, ev = _run(event(onset_ts=1000.0, lost_s=0.0), jv, 90.0, lambda d, p: (p, None), Policy())
    assert {d.strategy for d in decisions} == {"ignore"}
    assert 40.0 < ev.lost_s < 50.0


def test_a_long_severe_event_escalates_to_s4() -> None:
    # the split does not help (the fault is not compute in the replica); the slowdown goes on at 3x until
    # restart pays: it is planned (after validation), with approval
    m, pace = model(slow=3.0)

    def effect(d, p):
        return p, None if d.strategy == "validate" else False

    decisions, ev = _run(event(onset_ts=1000.0, lost_s=0.0), job(now=1000.0, model=m, pace_s=pace), 600.0, effect,
                         Policy(cooldown_s=30.0))
    acted = [d.strategy for d in decisions if d.strategy != "ignore"]
    assert acted == ["rebalance", "validate", "restart"]
    restart = decisions[[d.strategy for d in decisions].index("restart")]
    assert restart.needs_approval and restart.level == 4
    assert ev.lost_s >= COSTS.restart


def test_a_restart_onto_a_spare_beats_a_move_that_keeps_the_slow_device() -> None:
    """S3 and S4 both restart the job: S4 off the slow node onto a free spare is taken before the best
    placement when it leaves more net of its cost, and only then."""
    pol = Policy(approval=frozenset())
    caps = frozenset({"validate", "topology", "restart"})
    ev = event(lost_s=500.0, validated=True)
    topo = (TopologyOption((0, 3, 2, 1), 0.8, "slow n1 to stage 1"),)
    costs = replace(COSTS, topology=30.0, restart=30.0)
    d = decide(ev, job(topology=topo, spares=1, capabilities=caps), costs, pol)
    assert d.strategy == "restart" and d.chosen is not None and d.chosen.params["exclude_nodes"] == ["n1"]
    assert d.chosen.predicted_s == 0.55 and "leaves more than topology (predicted 0.800 s" in d.chosen.why
    (moved,) = [c for c in d.considered if c.strategy == "topology"]
    assert moved.ok and moved.saving_s is not None and d.chosen.saving_s > moved.saving_s
    # not validated yet: the validation comes first, for the restart
    v = decide(replace(ev, validated=None), job(topology=topo, spares=1, capabilities=caps), costs, pol)
    assert v.strategy == "validate" and v.reason == "confirm the suspects before restart"
    # the move stays the choice: S4 dearer by more than it saves (1000 s expected: 593 s against 280 s),
    # its price not paid yet, no free spare, the same restart ineffective before, or the move within
    # min_gain (5%) of the healthy pace
    for alt_costs, alt_ev, alt_job in (
            (replace(costs, restart=400.0), ev, {}),
            (replace(costs, restart=600.0), ev, {}),
            (costs, ev, {"spares": 0}),
            (costs, ev, {"ineffective": frozenset({signature("restart", {"exclude_nodes": ["n1"]})})}),
            (costs, ev, {"topology": (TopologyOption((0, 3, 2, 1), 0.55, "as healthy"),)}),
            (costs, ev, {"topology": (TopologyOption((0, 3, 2, 1), 0.575, "4.3% above healthy"),)})):
        alt = decide(alt_ev, job(**{"topology": topo, "spares": 1, "capabilities": caps, **alt_job}), alt_costs, pol)
        assert alt.strategy == "topology", (alt_costs, alt_ev, alt_job, alt)
    # a person asking for S3 gets S3
    forced = decide(ev, job(topology=topo, spares=1, capabilities=caps), costs, pol, force="topology")
    assert forced.strategy == "topology"
