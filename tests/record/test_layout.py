"""The byte layout: the Python mirror vs the C header (sizes, offsets, constants) and bad headers."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from c_ring import compile_c

from failslow.errors import InputError
from failslow.record import (
    DEFAULT_CAPACITY,
    HEADER_FIELDS,
    HEADER_SIZE,
    MAGIC,
    RECORD_DTYPE,
    RECORD_SIZE,
    VERSION,
    Control,
    Flag,
    Op,
    RingReader,
    RingWriter,
    parse_header,
)


def test_python_layout_matches_c_header(tmp_path: Path) -> None:
    rec_fields = list(RECORD_DTYPE.names or ())
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "failslow_ring.h"', "int main(void) {",
             'printf("record_size %zu\\n", sizeof(struct failslow_record));',
             'printf("header_size %zu\\n", sizeof(struct failslow_ring_header));']
    for f in rec_fields:
        lines.append(f'printf("rec.{f} %zu %zu\\n", offsetof(struct failslow_record, {f}), '
                     f"sizeof(((struct failslow_record*)0)->{f}));")
    for name, _fmt, _off in HEADER_FIELDS:
        lines.append(f'printf("hdr.{name} %zu %zu\\n", offsetof(struct failslow_ring_header, {name}), '
                     f"sizeof(((struct failslow_ring_header*)0)->{name}));")
    for cname, pyval in [("FAILSLOW_RING_HEADER_SIZE", HEADER_SIZE), ("FAILSLOW_RECORD_SIZE", RECORD_SIZE),
                         ("FAILSLOW_RING_DEFAULT_CAPACITY", DEFAULT_CAPACITY),
                         ("FAILSLOW_RING_VERSION", VERSION), ("FAILSLOW_CTL_PROFILE", int(Control.PROFILE)),
                         ("FAILSLOW_CTL_SUSPEND", int(Control.SUSPEND)),
                         ("FAILSLOW_OP_ALLTOALL", int(Op.ALLTOALL)), ("FAILSLOW_OP_COMM_SPLIT", int(Op.COMM_SPLIT)),
                         ("FAILSLOW_F_IN_GROUP", int(Flag.IN_GROUP)),
                         ("FAILSLOW_F_SUSPEND_TIMEOUT", int(Flag.SUSPEND_TIMEOUT))]:
        lines.append(f'printf("const.{cname} %llu {pyval}\\n", (unsigned long long)({cname}));')
    lines.append('printf("magic %s\\n", FAILSLOW_RING_MAGIC);')
    lines.append("return 0; }")
    exe = compile_c(tmp_path, "layout", "\n".join(lines))
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    got = {ln.split()[0]: ln.split()[1:] for ln in out}
    assert int(got["record_size"][0]) == RECORD_DTYPE.itemsize == RECORD_SIZE
    assert int(got["header_size"][0]) == HEADER_SIZE
    assert rec_fields, "dtype has fields"
    for f in rec_fields:
        off, size = (int(x) for x in got[f"rec.{f}"])
        dt, pyoff = RECORD_DTYPE.fields[f][:2]  # type: ignore[index]
        assert (off, size) == (pyoff, dt.itemsize), f
    for name, fmt, pyoff in HEADER_FIELDS:
        off, size = (int(x) for x in got[f"hdr.{name}"])
        assert (off, size) == (pyoff, struct.calcsize("<" + fmt)), name
    for k, v in got.items():
        if k.startswith("const."):
            assert v[0] == v[1], k
    assert got["magic"] == [MAGIC.rstrip(b"\0").decode()]


def test_bad_inputs_raise_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="power of two"):
        RingWriter.create(directory=tmp_path, capacity=100)
    with pytest.raises(InputError, match="cannot create"):
        RingWriter.create(directory=tmp_path / "missing", capacity=16)
    bad = tmp_path / "failslow-9.ring"
    bad.write_bytes(b"x" * 5000)
    with pytest.raises(InputError, match="not a failslow ring"):
        RingReader(bad)
    with pytest.raises(InputError, match="too short"):
        parse_header(b"abc")
