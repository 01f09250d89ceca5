"""Benchmarks: each `bench_<area>.py` measures one area side by side with its peer.

A module exposes `TITLE: str` and `run() -> str` returning the Markdown body of its section
(figures, the machine, the command, the peer, ratios from one run). `python -m bench [AREA ...]`
runs all (or the named) areas and rewrites their sections of docs/BENCHMARKS.md in place.
"""
