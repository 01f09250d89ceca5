"""Detector sharding: Prometheus' hashmod, the job regex, settings validation, and state a replica does not own."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from detector.metrics import DetectorMetrics
from detector.service import build
from detector.settings import Settings
from detector.shard import Shard, hashmod, job_regex
from detector.store import snapshot_name

# Prometheus relabel hashmod (model/relabel/relabel.go): binary.BigEndian.Uint64(md5.Sum([]byte(val))[8:]) % mod.
# Digests from `md5sum`; the last 16 hex digits read as an unsigned 64-bit integer, by hand.
KNOWN = [
    # value, md5 hex digest, last 8 bytes as uint64, {modulus: hashmod}
    ("train", "61b3a8faa9c1091806675c230a9abe64", 461438792400289380, {1: 0, 2: 0, 3: 0, 7: 5, 10: 0}),
    ("llm-a", "d313c4007b9eed13473113965c9873ee", 5129902987071222766, {2: 0, 3: 1, 4: 2, 10: 6}),
    # above 2**63: a signed read would give other residues
    ("job-0", "79f370f870c5da21eece6d84f2f58480", 17207811644008531072, {2: 0, 3: 1, 7: 2, 10: 2}),
    ("", "d41d8cd98f00b204e9800998ecf8427e", 16825458760271544958, {2: 0, 3: 1, 4: 2, 10: 8}),
    ("gpt-3/run 7", "c29ad1b96a669d21d54ef4ca27dae7b5", 15370491727351310261, {2: 1, 3: 2, 7: 5, 10: 1}),
    ("ü", "c03410a5204b21cd8229ff754688d743", 9379308578135398211, {2: 1, 4: 3, 7: 1}),  # UTF-8 bytes
]


@pytest.mark.parametrize(("value", "digest", "low64", "mods"), KNOWN)
def test_hashmod_is_prometheus_relabel_hashmod(value: str, digest: str, low64: int, mods: dict[int, int]) -> None:
    assert int(digest[16:], 16) == low64
    for modulus, want in mods.items():
        assert low64 % modulus == want
        assert hashmod(value, modulus) == want


def test_hashmod_rejects_a_zero_modulus() -> None:
    with pytest.raises(ValueError, match="modulus"):
        hashmod("train", 0)


def test_every_job_has_exactly_one_owner() -> None:
    jobs = [f"job-{i}" for i in range(200)]
    for n in (1, 2, 3, 5):
        owners = {j: [i for i in range(n) if Shard(i, n).owns(j)] for j in jobs}
        assert all(len(o) == 1 for o in owners.values())
        assert {o[0] for o in owners.values()} == set(range(n))  # 200 jobs reach every shard


def test_shard_rejects_an_index_outside_the_count() -> None:
    with pytest.raises(ValueError, match=r"not in 0\.\.1"):
        Shard(2, 2)
    with pytest.raises(ValueError, match="at least 1"):
        Shard(0, 0)


def _unquote(promql_string: str) -> str:
    """The value of a PromQL double-quoted string (only the escapes job_regex writes)."""
    assert promql_string[0] == promql_string[-1] == '"'
    body = promql_string[1:-1]
    assert not re.search(r'(?<!\\)(\\\\)*"', body), "unescaped quote"
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), body)


def test_job_regex_matches_exactly_the_given_jobs() -> None:
    jobs = ["llm-a", "llm.b+1", "rl|d", "vision(c)", 'q"f\\g', "t5*", "a[b]{2}^$?", "multi\nline"]
    rx = re.compile(_unquote(job_regex(jobs)))
    for j in jobs:
        assert rx.fullmatch(j), j
    for other in ["llmXb+1", "llm.bb1", "rl", "d", "visionc", "t5", "t55", "ab2", "", "llm-ab"]:
        assert not rx.fullmatch(other), other


def test_settings_validate_the_shard() -> None:
    assert (Settings().shards, Settings().shard) == (1, 0)
    assert (Settings(shards=4, shard=3).shards, Settings(shards=4, shard=3).shard) == (4, 3)
    with pytest.raises(ValidationError, match=r"shard 2 is out of range: with shards=2 the replicas are numbered 0\.\.1"):
        Settings(shards=2, shard=2)
    with pytest.raises(ValidationError, match="shards"):
        Settings(shards=0)
    with pytest.raises(ValidationError, match="shard"):
        Settings(shards=2, shard=-1)


def test_settings_read_the_shard_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_DETECTOR_SHARDS", "3")
    monkeypatch.setenv("FAILSLOW_DETECTOR_SHARD", "2")
    assert (Settings().shards, Settings().shard) == (3, 2)
    monkeypatch.setenv("FAILSLOW_DETECTOR_SHARD", "3")
    with pytest.raises(ValidationError, match="out of range"):
        Settings()


def test_cli_rejects_a_shard_outside_the_count(failslow_cmd: list[str]) -> None:
    p = subprocess.run([*failslow_cmd, "detector", "--shards", "2", "--shard", "2"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("failslow detector: ") and "out of range" in p.stderr


def test_snapshot_keys_are_per_replica() -> None:
    assert snapshot_name("p") == snapshot_name("p", 0, 1) == "p:snapshot"
    assert {snapshot_name("p", i, 3) for i in range(3)} == {"p:shard:0:snapshot", "p:shard:1:snapshot",
                                                            "p:shard:2:snapshot"}


def test_shard_metrics_are_exported() -> None:
    det = build(Settings(shards=3, shard=1, port=0), CollectorRegistry())
    reg = det.metrics.registry
    assert reg.get_sample_value("failslow_detector_shard") == 1.0
    assert reg.get_sample_value("failslow_detector_shards") == 3.0
    m = DetectorMetrics(CollectorRegistry())
    assert m.registry.get_sample_value("failslow_detector_shards") == 1.0
