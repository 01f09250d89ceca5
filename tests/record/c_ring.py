"""C helpers of the record tests: compile a program against shim/include/failslow_ring.h, and a C ring writer."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "shim" / "include"


def compile_c(tmp_path: Path, name: str, src: str) -> Path:
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    exe = tmp_path / name
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Werror", "-I", str(INCLUDE), "-o", str(exe), str(c)],
                   check=True, capture_output=True, text=True)
    return exe


C_WRITER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "failslow_ring.h"
/* argv: path capacity n_records [die_mid_write] */
int main(int argc, char **argv) {
    unsigned cap = (unsigned)atoi(argv[2]); long n = atol(argv[3]); int die = argc > 4;
    size_t size = FAILSLOW_RING_HEADER_SIZE + (size_t)cap * FAILSLOW_RECORD_SIZE;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return 3;
    struct failslow_ring_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return 4;
    memcpy(h->magic, FAILSLOW_RING_MAGIC, 8);
    h->version = FAILSLOW_RING_VERSION; h->header_size = FAILSLOW_RING_HEADER_SIZE;
    h->record_size = FAILSLOW_RECORD_SIZE; h->capacity = cap; h->pid = getpid(); h->rank = 5;
    h->world_size = 8; h->tp = 2; h->pp = 2; h->dp = 2; h->cp = 1; h->node_id = 1;
    h->producer = FAILSLOW_PRODUCER_SHIM; strcpy(h->job, "cjob"); strcpy(h->hostname, "chost");
    for (long i = 0; i < n; i++) {
        uint64_t s; struct failslow_record *r = failslow_ring_claim(h, &s);
        if (!r) continue;
        r->comm = 0xabcdef0123456789ull; r->count = (uint64_t)i; r->bytes = (uint64_t)i * 4;
        r->t_enqueue_ns = 1000 + i; r->t_start_ns = 2000 + i; r->t_end_ns = 3000 + i; r->t_return_ns = 4000 + i;
        r->nranks = 4; r->comm_rank = 1; r->peer = (int32_t)(i % 3) - 1; r->op = (uint16_t)(1 + i % 8);
        r->dtype = 7; r->group_depth = 1; r->flags = FAILSLOW_F_HOST_TIMES; r->tid = 42; r->stream = 99;
        r->aux = 7; r->device = 3;
        if (die && i == n - 1) { r->count = 12345; _exit(0); }  /* exits with the slot BUSY */
        failslow_ring_commit(r, s);
    }
    printf("%llu\n", (unsigned long long)h->write_index);
    return 0;
}
"""
