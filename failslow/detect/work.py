"""The work an iteration does, so that a batch-size ramp-up is not taken for a slowdown.

Megatron-LM's ``--rampup-batch-size START INCR SAMPLES`` grows the global batch stair by stair, and each
stair makes every iteration longer: from the iteration time alone a stair is a slowdown of the whole job
(one real run on an H200, tests/data/healthy_logs/failslow_gpt_ramp_h200.log.gz, doubled its batch from 32 to
64 at iteration 109 and the detector's defaults opened an event there). Where the global batch size of
each iteration is known, the detector reads seconds per sample instead: a stair then lowers the series
(the fixed per-iteration costs spread over more samples) and a component that slows down still raises it
by its factor.

Two ways in:

* training logs: :func:`parse_megatron_log` reads Megatron-LM's iteration lines (``elapsed time per
  iteration (ms)`` and ``global batch size``), for `failslow detect`;
* the detector service: a job publishes its samples per iteration as the gauge
  ``failslow_iteration_samples{job}`` (:data:`SAMPLES_METRIC`; through the exporter's textfile directory,
  :func:`samples_textfile`), and the service divides that job's iteration times by it (:func:`per_sample`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

#: The gauge a job publishes with the samples (global batch size) of its current iterations.
SAMPLES_METRIC = "failslow_iteration_samples"

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*(?:/\s*[^|\s]+\s*)?\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")
_BATCH = re.compile(r"global batch size:\s*([0-9]+)")
_LABEL_VALUE = re.compile(r'^[^"\\\n]*$')


def per_sample(seconds: float, samples: float) -> float:
    """Seconds per sample of an iteration that took ``seconds`` for ``samples`` samples; NaN when either is
    not a positive finite number (a missing sample for the detector, never a wrong one)."""
    if not (samples > 0 and math.isfinite(samples) and seconds > 0 and math.isfinite(seconds)):
        return math.nan
    return seconds / samples


@dataclass(frozen=True)
class TrainingLog:
    """The iteration lines of one training log, in the order logged.

    Attributes:
        steps: The iteration number of each line (it can go back after a restart from a checkpoint).
        seconds: Its ``elapsed time per iteration`` in seconds (Megatron: the mean over the log interval).
        global_batch: Its ``global batch size`` (NaN where the line has none).
    """

    steps: npt.NDArray[np.int64]
    seconds: npt.NDArray[np.float64]
    global_batch: npt.NDArray[np.float64]

    @property
    def ramped(self) -> bool:
        """Whether the global batch size changes within the log (every line must then give it)."""
        b = self.global_batch[~np.isnan(self.global_batch)]
        return bool(b.size) and bool((b != b[0]).any())

    def series(self) -> tuple[str, npt.NDArray[np.float64]]:
        """What the detector should read: ``("seconds_per_sample", ...)`` when the batch size changes,
        else ``("seconds", ...)``.

        Raises:
            InputError: the batch size changes but some lines do not give it.
        """
        if not self.ramped:
            return "seconds", self.seconds
        missing = np.flatnonzero(np.isnan(self.global_batch))
        if missing.size:
            raise InputError(f"the global batch size changes within the log but {missing.size} iteration "
                             f"line(s) do not give it (first: iteration {int(self.steps[missing[0]])})")
        return "seconds_per_sample", self.seconds / self.global_batch


def looks_like_megatron_log(text: str) -> bool:
    """Whether ``text`` holds Megatron-LM iteration lines (looked for in its first 1,000 lines)."""
    return any(_ELAPSED.search(line) and _ITERATION.search(line) for line in text.splitlines()[:1000])


def parse_megatron_log(text: str) -> TrainingLog:
    """The iteration lines of a Megatron-LM training log.

    A line counts when it has ``iteration N`` (optionally ``N/ TOTAL`` or ``N/infinity``) and ``elapsed time
    per iteration (ms): X`` (newer releases print ``X/MEAN``, the mean of recent iterations: X is read),
    whatever precedes it (timestamps, launcher rank prefixes); ``global batch size: G`` is read when
    present. Validation, checkpoint and other lines are skipped.

    Raises:
        InputError: no iteration line, or a line whose time is not a positive number.
    """
    steps: list[int] = []
    secs: list[float] = []
    batch: list[float] = []
    for k, line in enumerate(text.splitlines(), start=1):
        m_el = _ELAPSED.search(line)
        m_it = _ITERATION.search(line)
        if not (m_el and m_it):
            continue
        ms = float(m_el.group(1))
        if not (ms > 0 and math.isfinite(ms)):
            raise InputError(f"line {k}: elapsed time per iteration {m_el.group(1)} ms is not a positive number")
        m_b = _BATCH.search(line)
        steps.append(int(m_it.group(1)))
        secs.append(ms / 1000.0)
        batch.append(float(m_b.group(1)) if m_b else math.nan)
    if not steps:
        raise InputError("no Megatron-LM iteration lines ('iteration N | ... elapsed time per iteration (ms): X')")
    if any(b == 0 for b in batch):
        raise InputError("a global batch size of 0 in the log")
    return TrainingLog(np.array(steps, dtype=np.int64), np.array(secs), np.array(batch))


def samples_textfile(job: str, samples: int) -> str:
    """The exporter textfile (Prometheus text format) that tells the detector a job's samples per iteration.

    Write it into the exporter's ``--textfile-dir`` atomically (a temporary file, then a rename) whenever
    the global batch size changes, e.g. from the training loop after Megatron's ``update_num_microbatches``.

    Raises:
        InputError: an empty or unquotable job name, or samples not positive.
    """
    if not job or not _LABEL_VALUE.match(job):
        raise InputError(f"job name {job!r} cannot be a label value (empty, or has a quote, backslash or newline)")
    if samples <= 0:
        raise InputError(f"samples per iteration must be positive, got {samples}")
    return (f"# HELP {SAMPLES_METRIC} Samples (global batch size) of the job's current iterations.\n"
            f"# TYPE {SAMPLES_METRIC} gauge\n"
            f'{SAMPLES_METRIC}{{job="{job}"}} {int(samples)}\n')
