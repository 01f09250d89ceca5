"""The remediator's config file: parsed strictly, every mistake named."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.errors import InputError
from remediator.config import parse_config, read_config


def test_defaults_and_first_match_wins() -> None:
    cfg = parse_config(None)
    assert cfg.jobs == () and cfg.rule_for("x") is None
    cfg = parse_config({"jobs": [{"match": "llm-.*", "adapter": "slurm"}, {"match": ".*", "adapter": "fake"}],
                        "policy": {"cooldown_s": 10, "approval": ["restart", "topology"], "max_actions_per_hour": 2},
                        "costs": {"restart": 30}})
    assert cfg.rule_for("llm-7").adapter == "slurm" and cfg.rule_for("other").adapter == "fake"
    assert cfg.rule_for("xllm-7").adapter == "fake"  # whole-label match
    assert cfg.policy.cooldown_s == 10 and cfg.policy.approval == {"restart", "topology"}
    assert cfg.costs.restart == 30 and cfg.costs.rebalance == 2
    assert cfg.costs_given == {"restart"}  # the rest are defaults an adapter's estimate may replace


@pytest.mark.parametrize("doc, words", [
    ([], "mapping"),
    ({"jobz": []}, "unknown keys"),
    ({"jobs": {}}, "list"),
    ({"jobs": [{"match": "(", "adapter": "fake"}]}, "match"),
    ({"jobs": [{"match": "x", "adapter": "k8s"}]}, "unknown adapter"),
    ({"jobs": [{"match": "x", "adapter": "fake", "options": []}]}, "options"),
    ({"jobs": [{"match": "x", "adapter": "fake", "extra": 1}]}, "mapping with"),
    ({"policy": {"cooldown": 1}}, "unknown policy"),
    ({"policy": {"cooldown_s": "soon"}}, "number"),
    ({"policy": {"approval": "restart"}}, "list"),
    ({"policy": {"min_gain": 2}}, "min_gain"),
    ({"costs": {"reboot": 1}}, "costs"),
    ({"costs": {"restart": -1}}, ">= 0"),
])
def test_bad_configs_are_refused_with_where(doc: object, words: str) -> None:
    with pytest.raises(InputError, match=words):
        parse_config(doc)


def test_reading(tmp_path: Path) -> None:
    p = tmp_path / "r.yml"
    p.write_text("jobs:\n  - {match: 'a.*', adapter: testbed, options: {run_dir: '/tmp/{job}'}}\n")
    assert read_config(p).rule_for("ab").options == {"run_dir": "/tmp/{job}"}
    with pytest.raises(InputError, match="config"):
        read_config(tmp_path / "missing.yml")
    p.write_text("jobs: [")
    with pytest.raises(InputError, match="not YAML"):
        read_config(p)


@pytest.mark.parametrize("costs", [{"reboot": 1.0}, {"restart": -1.0}, {"restart": True}, {"restart": "1"}])
def test_the_fake_adapters_expected_costs_are_seconds_per_strategy(costs: dict[str, object]) -> None:
    from remediator.adapters.base import ConfigError
    from remediator.adapters.fake import Adapter

    with pytest.raises(ConfigError, match="expected_costs"):
        Adapter("j", {}, {"expected_costs": costs})
    assert Adapter("j", {}, {"expected_costs": {"restart": 3}}).info().costs == {"restart": 3.0}
