"""What-if analysis of straggling in hybrid-parallel training (trace -> simulated ideal -> slowdowns).

Typical use::

    from failslow.whatif import read_trace, read_meta, analyze
    result = analyze(read_trace("trace.parquet", read_meta("meta.yaml")))
    print(result.S, result.root_cause.verdict)

See docs/whatif.md for the definitions, the dependency model and how to extend it.
"""

from failslow.whatif.analysis import WhatIfResult, analyze
from failslow.whatif.model import Model, build_model
from failslow.whatif.rootcause import RootCause
from failslow.whatif.trace import JobMeta, Trace, find_meta, read_meta, read_trace, trace_from_columns

__all__ = [
    "JobMeta", "Model", "RootCause", "Trace", "WhatIfResult", "analyze", "build_model", "find_meta",
    "read_meta", "read_trace", "trace_from_columns",
]
