"""Profile parsing and rate units."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.predict.profile import parse_profile, parse_rate, profile_to_doc, read_profile
from tests.predict.profiles import make_profile


@pytest.mark.parametrize(("text", "bytes_per_s"), [
    ("100mbit", 12.5e6), ("8bit", 1.0), ("1gbit", 125e6), ("12.5MB/s", 12.5e6), ("2MiB/s", 2 * 1024**2),
    ("1e6", 1e6), ("250kbit", 31250.0), ("3 kB/s", 3000.0),
])
def test_parse_rate_units(text: str, bytes_per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text", ["", "fast", "10 parsecs", "-5mbit", "0", "1e999"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(InputError):
        parse_rate(text)


def test_round_trip_keeps_everything() -> None:
    p = make_profile(jitter=0.1, overlap=True)
    q = parse_profile(json.loads(json.dumps(profile_to_doc(p))))
    assert q.layers == p.layers
    assert q.overlap and q.batch_size == 32 and q.latency_s == p.latency_s
    np.testing.assert_allclose(q.step_forward_s, p.step_forward_s)
    assert q.effective_bandwidth == pytest.approx(9.5e6)
    assert q.model_bytes == pytest.approx(sum(100_000 * (i + 1) for i in range(6)))


def _doc() -> dict:
    return profile_to_doc(make_profile(jitter=0.1))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(format="other/1"), "unsupported format"),
    (lambda d: d.update(layers=[]), "non-empty"),
    (lambda d: d["layers"][0].update(forward_s=-1), "non-negative"),
    (lambda d: d["layers"][0].pop("param_bytes"), "missing 'param_bytes'"),
    (lambda d: d.update(batch_size=0), "batch_size"),
    (lambda d: d["link"].update(bandwidth_bytes_per_s=0), "positive"),
    (lambda d: d["link"].update(efficiency=7), "implausible"),
    (lambda d: d["steps"].update(forward_s=[[1.0, 2.0]]), "shape"),
    (lambda d: d.update(overlap="yes"), "overlap"),
    (lambda d: d["layers"][1].update(backward_s="slow"), "finite number"),
])
def test_parse_profile_rejects_bad_documents(mutate, message: str) -> None:
    d = _doc()
    mutate(d)
    with pytest.raises(InputError, match=message):
        parse_profile(d)


def test_read_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_profile(bad)
    with pytest.raises(InputError, match="cannot read"):
        read_profile(tmp_path)


def test_after_idle_samples_round_trip_and_replace_the_steps() -> None:
    p = make_profile(jitter=0.1)
    idle_f = p.step_forward_s * 0.9
    idle_b = p.step_backward_s * 0.9
    doc = profile_to_doc(p)
    doc["steps"].update(idle_forward_s=idle_f.tolist(), idle_backward_s=idle_b.tolist())
    q = parse_profile(json.loads(json.dumps(doc)))
    np.testing.assert_allclose(q.idle_step_forward_s, idle_f)
    r = parse_profile(profile_to_doc(q))  # written back too
    np.testing.assert_allclose(r.idle_step_backward_s, idle_b)
    a = q.after_idle()
    np.testing.assert_allclose(a.step_forward_s, idle_f)
    np.testing.assert_allclose(a.forward_s, np.median(idle_f, axis=0))
    np.testing.assert_allclose(a.backward_s, np.median(idle_b, axis=0))
    plain = make_profile()
    assert plain.after_idle() is plain  # nothing recorded: the profile itself
    doc["steps"]["idle_backward_s"] = [[1.0]]
    with pytest.raises(InputError, match="idle_backward_s"):
        parse_profile(doc)


def test_after_transfer_samples_parse_and_fall_back_to_after_idle() -> None:
    d = _doc()
    rows = d["steps"]["forward_s"]
    d["steps"]["idle_forward_s"] = [[x * 0.5 for x in r] for r in rows]
    d["steps"]["idle_backward_s"] = d["steps"]["backward_s"]
    p = parse_profile(d)
    assert p.after_transfer().forward_s.sum() == pytest.approx(p.after_idle().forward_s.sum())
    d["steps"]["net_forward_s"] = [[x * 2 for x in r] for r in rows]
    d["steps"]["net_backward_s"] = d["steps"]["backward_s"]
    q = parse_profile(d)
    assert q.after_transfer().forward_s.sum() == pytest.approx(2 * np.median(np.array(rows), axis=0).sum())
    d["steps"]["net_backward_s"] = d["steps"]["backward_s"][:3]
    with pytest.raises(InputError, match=r"net_forward_s and steps\.net_backward_s differ"):
        parse_profile(d)


def test_after_allreduce_samples_parse_and_fall_back_to_after_idle() -> None:
    d = _doc()
    rows = d["steps"]["forward_s"]
    d["steps"]["idle_forward_s"] = [[x * 0.5 for x in r] for r in rows]
    d["steps"]["idle_backward_s"] = d["steps"]["backward_s"]
    assert parse_profile(d).after_allreduce().forward_s.sum() == pytest.approx(
        parse_profile(d).after_idle().forward_s.sum())
    d["steps"]["ring_forward_s"] = [[x * 3 for x in r] for r in rows]
    d["steps"]["ring_backward_s"] = d["steps"]["backward_s"]
    q = parse_profile(d)
    assert q.after_allreduce().forward_s.sum() == pytest.approx(3 * np.median(np.array(rows), axis=0).sum())
    d["steps"]["ring_backward_s"] = d["steps"]["backward_s"][:3]
    with pytest.raises(InputError, match=r"ring_forward_s and steps\.ring_backward_s differ"):
        parse_profile(d)
