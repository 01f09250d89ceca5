"""failslow: the pure core.

Topology model, ring record contract, period inference, change-point detection, culprit analysis,
what-if simulation and throughput prediction. numpy/scipy only; nothing here performs I/O at import
time or depends on a running service.
"""

__version__ = "0.1.0"
