"""The record contract: a per-process ring of fixed-size call records in shared memory (Python mirror).

Every tracking path (the C NCCL shim, the torch.distributed hook, tests) writes one ring per process;
the exporter and `failslow shim-dump` read them. The byte layout is defined by the C header
`shim/include/failslow_ring.h` (the source of truth); `failslow.record.layout` mirrors it and is tested
against it (sizes and offsets from a compiled C program, and a ring written by C decoded here).

Modules, one concept each:
  * `layout`: constants, enums, the record dtype, the header fields; build and parse a header (pure).
  * `files`: identity from the environment, ring paths and discovery, reading a ring file's header,
    whether a producer is alive.
  * `writer`: `RingWriter`, the Python producer (commit protocol).
  * `reader`: `RingReader`, the consumer, and the `failslow shim-dump` view (`record_to_dict`, `dump_ring`).
  * `calls`: `Calls`, the call table every multi-rank analysis reads (culprit analysis, benches): the
    completed calls of many ranks as parallel arrays on one wall clock (`calls_from_records`,
    `calls_from_ring_dir`).
  * `torchhook`: the torch.distributed hook that writes rings (``failslow.record.torchhook``, with its
    helpers `torchcomm` and `torchwrap`); not imported here, so importing this package never loads it.

This package re-exports the public names of `layout`, `files`, `writer`, `reader` and `calls`.
"""

from failslow.record.calls import RECV, SEND, Calls, calls_from_records, calls_from_ring_dir
from failslow.record.files import (
    env_identity,
    find_rings,
    process_alive,
    read_header,
    ring_dir,
    ring_path,
)
from failslow.record.layout import (
    CALL_OPS,
    DEFAULT_CAPACITY,
    DEFAULT_DIR,
    DTYPE_NAMES,
    DTYPE_UNKNOWN,
    HEADER_FIELDS,
    HEADER_SIZE,
    MAGIC,
    MAX_CAPACITY,
    MIN_CAPACITY,
    OP_NAMES,
    RECORD_DTYPE,
    RECORD_SIZE,
    RING_PREFIX,
    RING_SUFFIX,
    STAMP_BUSY,
    VERSION,
    ClockSource,
    Control,
    Feature,
    Flag,
    Op,
    Producer,
    RingHeader,
    build_header,
    parse_header,
)
from failslow.record.reader import RingReader, dump_ring, record_to_dict
from failslow.record.writer import RingWriter

__all__ = [
    "CALL_OPS",
    "DEFAULT_CAPACITY",
    "DEFAULT_DIR",
    "DTYPE_NAMES",
    "DTYPE_UNKNOWN",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_CAPACITY",
    "MIN_CAPACITY",
    "OP_NAMES",
    "RECORD_DTYPE",
    "RECORD_SIZE",
    "RECV",
    "RING_PREFIX",
    "RING_SUFFIX",
    "SEND",
    "STAMP_BUSY",
    "VERSION",
    "Calls",
    "ClockSource",
    "Control",
    "Feature",
    "Flag",
    "Op",
    "Producer",
    "RingHeader",
    "RingReader",
    "RingWriter",
    "build_header",
    "calls_from_records",
    "calls_from_ring_dir",
    "dump_ring",
    "env_identity",
    "find_rings",
    "parse_header",
    "process_alive",
    "read_header",
    "record_to_dict",
    "ring_dir",
    "ring_path",
]
