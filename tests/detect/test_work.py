"""Work per iteration (`failslow.detect.work`): Megatron-LM log lines, seconds per sample, the samples gauge,
and `failslow detect` on a training log with a batch-size ramp-up."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from failslow.detect.work import (
    SAMPLES_METRIC,
    looks_like_megatron_log,
    parse_megatron_log,
    per_sample,
    samples_textfile,
)
from failslow.errors import InputError

RAMP = Path(__file__).resolve().parents[1] / "data" / "healthy_logs" / "failslow_gpt_ramp_h200.log.gz"

#: Megatron-LM's iteration lines as its training_log prints them (releases differ: ``N/ TOTAL`` or
#: ``N/infinity``, ``X`` or ``X/MEAN`` ms), with a launcher prefix, a log interval of 10 and the other
#: lines a real log has.
MEGATRON = """\
using world size: 8, data-parallel size: 2, context-parallel size: 1, tensor-model-parallel size: 2
[default0]: [2025-01-01 10:00:00] iteration       10/  500000 | consumed samples:          160 | elapsed time per iteration (ms): 1520.3 | throughput per GPU (TFLOP/s/GPU): 120.1 | learning rate: 1.5E-06 | global batch size:    16 | lm loss: 1.02E+01 | loss scale: 1.0 | grad norm: 5.1 | number of skipped iterations:   0 | number of nan iterations:   0 |
[default0]: [2025-01-01 10:00:15] iteration       20/  500000 | consumed samples:          480 | elapsed time per iteration (ms): 2411.0 | learning rate: 3.0E-06 | global batch size:    32 | lm loss: 9.8E+00 |
[default0]: validation loss at iteration 20 | lm loss value: 9.7E+00 | lm loss PPL: 1.6E+04 |
[default0]:  successfully saved checkpoint from iteration      20 to /ckpt
 [2025-01-01 10:00:40] iteration       30/  500000 | consumed samples:          800 | elapsed time per iteration (ms): 2.4e3 | global batch size:    32 |
 [2025-01-01 10:00:55.123456] iteration       40/infinity | consumed samples:         1120 | elapsed time per iteration (ms): 2390.5/2400.2 | global batch size:    48 |
"""


def test_megatron_lines_are_read_whatever_precedes_them() -> None:
    assert looks_like_megatron_log(MEGATRON)
    log = parse_megatron_log(MEGATRON)
    assert log.steps.tolist() == [10, 20, 30, 40]
    assert log.seconds.tolist() == pytest.approx([1.5203, 2.411, 2.4, 2.3905])
    assert log.global_batch.tolist() == [16, 32, 32, 48]
    assert log.ramped
    name, v = log.series()
    assert name == "seconds_per_sample"
    assert v.tolist() == pytest.approx([1.5203 / 16, 2.411 / 32, 2.4 / 32, 2.3905 / 48])


def test_a_log_without_batch_changes_is_read_per_iteration() -> None:
    text = "iteration 1 | elapsed time per iteration (ms): 100.0 |\niteration 2 | elapsed time per iteration (ms): 110\n"
    log = parse_megatron_log(text)
    assert not log.ramped and np.isnan(log.global_batch).all()
    name, v = log.series()
    assert name == "seconds" and v.tolist() == pytest.approx([0.1, 0.11])


@pytest.mark.parametrize(("text", "message"), [
    ("value\n1\n2\n", "no Megatron-LM iteration lines"),
    ("iteration 1 | elapsed time per iteration (ms): 0 |\n", "not a positive number"),
    ("iteration 1 | elapsed time per iteration (ms): 5 | global batch size: 0 |\n", "global batch size of 0"),
])
def test_bad_logs_are_input_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_megatron_log(text)


def test_a_ramp_with_lines_missing_the_batch_size_is_refused() -> None:
    text = ("iteration 1 | elapsed time per iteration (ms): 5 | global batch size: 16 |\n"
            "iteration 2 | elapsed time per iteration (ms): 9 | global batch size: 32 |\n"
            "iteration 3 | elapsed time per iteration (ms): 9 |\n")
    with pytest.raises(InputError, match="iteration 3"):
        parse_megatron_log(text).series()


def test_per_sample_is_nan_rather_than_wrong() -> None:
    assert per_sample(2.0, 64) == pytest.approx(2.0 / 64)
    for seconds, samples in ((2.0, 0), (2.0, -1), (2.0, math.nan), (math.nan, 64), (0.0, 64), (2.0, math.inf)):
        assert math.isnan(per_sample(seconds, samples))


def test_the_samples_textfile_is_a_gauge_prometheus_parses() -> None:
    fams = list(text_string_to_metric_families(samples_textfile("gpt-175b", 1536)))
    assert [f.name for f in fams] == [SAMPLES_METRIC] and fams[0].type == "gauge"
    assert [(s.labels, s.value) for s in fams[0].samples] == [({"job": "gpt-175b"}, 1536.0)]
    for job, n in (("", 8), ('a"b', 8), ("ok", 0)):
        with pytest.raises(InputError):
            samples_textfile(job, n)


def _detect(cmd: list[str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "detect", *args], input=stdin, capture_output=True, text=True, timeout=120,
                          check=False)


def test_cli_reads_the_ramp_log_per_sample_and_names_iterations(failslow_cmd: list[str]) -> None:
    p = _detect(failslow_cmd, str(RAMP))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["series"] == "seconds_per_sample" and doc["n"] == 257
    # no stair of the ramp is a change point: they are at iterations 109, 163, 199, 226, 247
    stairs = {109, 163, 199, 226, 247}
    assert all(cp["iteration"] not in stairs for cp in doc["change_points"]), doc["change_points"]
    # the same lines without the batch size: read per iteration, the first stair is a change (+80%)
    with gzip.open(RAMP, "rt") as f:
        bare = "".join(ln.split("| global batch size:")[0] + "|\n" for ln in f)
    p = _detect(failslow_cmd, "-", stdin=bare)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["series"] == "seconds"
    first = doc["change_points"][0]
    assert first["iteration"] == 109 and first["ratio"] > 1.5


def test_cli_log_errors_exit_2(tmp_path: Path, failslow_cmd: list[str]) -> None:
    f = tmp_path / "train.log"
    f.write_text(MEGATRON)
    p = _detect(failslow_cmd, "--column", "x", str(f))
    assert p.returncode == 2 and "training log" in p.stderr
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(b"not gzip")
    p = _detect(failslow_cmd, str(bad))
    assert p.returncode == 2 and "cannot read" in p.stderr
