"""Iteration period inference from a process's stream of communication calls (framework-agnostic).

Training is periodic: every iteration issues the same sequence of collectives and point-to-point calls,
separated by the same compute. Knowing only the call stream of one rank (what the shim or the torch
hook records) we recover *how many calls make one iteration*, where iterations begin, and how long
each one took — without knowing the framework, the model or the schedule.

`estimate_period` is the batch form for one stationary stretch of calls. `PeriodTracker` is the
streaming form (``update(batch) -> PeriodVerdict``) with a bounded buffer: it emits each completed
iteration once, re-estimates periodically, and restarts estimation when the call pattern changes
(e.g. the micro-batch count changes) or when records were lost. `infer_iterations` runs the tracker
over a whole recorded sequence.

Modules: ``symbols`` (calls as symbols, the lags at which they repeat), ``gaps`` (the gap signal and the
gap split), ``folds`` (the lag the gaps choose, the block test), ``confidence`` (the threshold, cycles and
regularity of iteration times), ``acf`` (`estimate_period`), ``boundaries`` (where iterations begin and are
marked), ``template`` (the tracker's gap template), ``tracker`` (`PeriodTracker`), ``verdict`` (`PeriodVerdict`), ``iterations``
(`infer_iterations`), ``rank`` (`RankTrack`: one ring's records to iterations, the compute/comm split
and per-communicator totals, as the exporter reads them live), ``io`` (call files: CSV, shim-dump JSON
lines), ``profiler_trace`` (PyTorch profiler traces), ``synth`` (seeded synthetic call streams with ground truth), ``numeric`` (array aliases, FFT sums).
"""

from failslow.period.acf import PeriodEstimate, estimate_period
from failslow.period.confidence import CONFIDENCE_MIN, find_cycle, regularity
from failslow.period.gaps import GapSplit, gap_signal, split_by_gaps
from failslow.period.io import CallSequence, finite_float, parse_calls, parse_csv, parse_jsonl, read_calls
from failslow.period.iterations import IterationResult, infer_iterations
from failslow.period.profiler_trace import (
    TRACE_SUFFIXES,
    ProfilerTrace,
    StepComparison,
    compare_steps,
    decompress,
    is_profiler_trace,
    parse_profiler_trace,
    read_profiler_trace,
    trace_files,
)
from failslow.period.rank import RankTrack, replay_ring
from failslow.period.symbols import encode_symbols, symbol_mismatch
from failslow.period.tracker import PeriodTracker
from failslow.period.verdict import PeriodVerdict

__all__ = [
    "CONFIDENCE_MIN", "TRACE_SUFFIXES", "CallSequence", "GapSplit", "IterationResult", "PeriodEstimate",
    "PeriodTracker", "PeriodVerdict", "ProfilerTrace", "RankTrack", "StepComparison", "compare_steps", "decompress",
    "encode_symbols", "estimate_period", "find_cycle", "finite_float", "gap_signal", "infer_iterations",
    "is_profiler_trace", "parse_calls", "parse_csv", "parse_jsonl", "parse_profiler_trace", "read_calls",
    "read_profiler_trace", "regularity", "replay_ring", "split_by_gaps", "symbol_mismatch", "trace_files",
]
