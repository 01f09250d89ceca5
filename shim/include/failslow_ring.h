/*
 * failslow_ring.h — the record contract: one per-process ring of fixed-size call records in shared memory.
 *
 * This header is the single source of truth for the byte layout. The Python mirror
 * (failslow/record/layout.py) is tested against it (sizes and offsets of every field, and a ring written by
 * C decoded by Python).
 *
 * File: $FAILSLOW_SHM_DIR/failslow-<pid>.ring (default directory /dev/shm), FAILSLOW_RING_HEADER_SIZE bytes of
 * header followed by `capacity` records of FAILSLOW_RECORD_SIZE bytes. capacity is a power of two.
 *
 * Commit protocol (per-slot sequence stamp, a seqlock that never blocks the writer):
 *   - a writer claims seq s = ++write_index (atomic fetch-add, so any thread may write), slot = (s-1) % cap;
 *   - it CASes the slot's stamp from a committed older value (< s, BUSY clear) to s|BUSY; if the slot is
 *     BUSY (another writer still inside it after a full wrap) or already holds something newer, the writer
 *     gives up on this record and counts it in `dropped` — it never waits;
 *   - it writes the payload, then stores stamp = s with release semantics ("commit").
 *   A reader expecting seq e in a slot loads the stamp (acquire), copies the record, fences (acquire) and
 *   loads the stamp again: the copy is valid only when both loads equal e. A stamp whose sequence part is
 *   larger than e means the slot was overwritten (record lost, counted by the reader). A stamp smaller than
 *   e, or e|BUSY, means "claimed, not committed yet" (pending): the reader waits for it unless the producer
 *   process is dead or the pending slot is older than the reader's timeout.
 *   Records that need a late field (CUDA event times) stay BUSY until the resolver thread fills them in.
 *
 * Timestamps are CLOCK_MONOTONIC ns. header.clock_offset_ns = CLOCK_REALTIME - CLOCK_MONOTONIC at creation.
 * (The shim may read them from the CPU's invariant counter mapped onto CLOCK_MONOTONIC: within < 1 us of
 * clock_gettime, measured ~50 ns; see docs/shim.md "The record clock".)
 */
#ifndef FAILSLOW_RING_H
#define FAILSLOW_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAILSLOW_RING_MAGIC "FSLRING"     /* 7 chars + NUL = 8 bytes */
#define FAILSLOW_RING_VERSION 1u
#define FAILSLOW_RING_HEADER_SIZE 4096u
#define FAILSLOW_RECORD_SIZE 128u
#define FAILSLOW_RING_DEFAULT_CAPACITY 65536u /* 64k records x 128 B = 8 MiB per process */
#define FAILSLOW_RING_MIN_CAPACITY 16u
#define FAILSLOW_RING_MAX_CAPACITY (1u << 24)
#define FAILSLOW_STAMP_BUSY (1ull << 63)

/* Control word bits (header.control), set by readers/controllers, read by the producer. */
#define FAILSLOW_CTL_PROFILE 1u /* GPU timing with CUDA events (shim only) */
#define FAILSLOW_CTL_SUSPEND 2u /* hooked calls wait (bounded) until cleared */

/* header.producer */
#define FAILSLOW_PRODUCER_UNKNOWN 0u
#define FAILSLOW_PRODUCER_SHIM 1u
#define FAILSLOW_PRODUCER_TORCH 2u
#define FAILSLOW_PRODUCER_PYTHON 3u

/* header.clock_source: how the producer takes its timestamps (all are CLOCK_MONOTONIC ns) */
#define FAILSLOW_CLOCK_MONOTONIC 0u /* clock_gettime(CLOCK_MONOTONIC) / time.monotonic_ns() */
#define FAILSLOW_CLOCK_TSC 1u       /* the CPU's invariant counter mapped onto CLOCK_MONOTONIC (< 1 us off) */

/* header.features */
#define FAILSLOW_FEAT_CUDA 1u      /* libcudart loaded: PROFILE can take effect */
#define FAILSLOW_FEAT_REAL_NCCL 2u /* the real NCCL entry points were resolved */

/* record.op: collectives and point-to-point calls (< 64) and control events (>= 64). */
enum failslow_op {
    FAILSLOW_OP_UNKNOWN = 0,
    FAILSLOW_OP_ALLREDUCE = 1,
    FAILSLOW_OP_ALLGATHER = 2,
    FAILSLOW_OP_REDUCESCATTER = 3,
    FAILSLOW_OP_BROADCAST = 4,
    FAILSLOW_OP_REDUCE = 5,
    FAILSLOW_OP_ALLTOALL = 6,
    FAILSLOW_OP_SEND = 7,
    FAILSLOW_OP_RECV = 8,
    FAILSLOW_OP_BARRIER = 9,
    FAILSLOW_OP_GATHER = 10,
    FAILSLOW_OP_SCATTER = 11,
    FAILSLOW_OP_ALLTOALLV = 12,
    /* control events: not calls; exporters must not count them as collectives */
    FAILSLOW_OP_COMM_INIT = 64,    /* comm = new id, count = 0, nranks/comm_rank/device filled */
    FAILSLOW_OP_COMM_SPLIT = 65,   /* aux = parent comm id, peer = color, count = key */
    FAILSLOW_OP_COMM_DESTROY = 66,
    FAILSLOW_OP_COMM_ABORT = 67,
};

/* record.flags */
#define FAILSLOW_F_HOST_TIMES 0x1u  /* t_start/t_end are host times (entry / return or completion) */
#define FAILSLOW_F_GPU_TIMES 0x2u   /* t_start/t_end are GPU kernel times mapped to CLOCK_MONOTONIC */
#define FAILSLOW_F_ASYNC 0x4u       /* async work handle: t_end is when completion was observed */
#define FAILSLOW_F_IN_GROUP 0x8u    /* issued inside ncclGroupStart/End (or a coalesced p2p batch) */
#define FAILSLOW_F_GPU_FAILED 0x10u /* PROFILE was on but the GPU times could not be obtained */
#define FAILSLOW_F_ERROR 0x20u      /* the real call returned an error */
#define FAILSLOW_F_END_AT_WAIT 0x40u /* t_end observed at wait(): an upper bound on completion */
#define FAILSLOW_F_SUSPENDED 0x80u  /* the call was held by the SUSPEND control bit */
#define FAILSLOW_F_SUSPEND_TIMEOUT 0x100u /* ...and released by the timeout, not by the controller */

/* record.dtype: NCCL's ncclDataType_t numbering; 255 = unknown/other. */
#define FAILSLOW_DTYPE_UNKNOWN 255u

/* One collective or point-to-point call (or a control event). 128 bytes, naturally aligned, little-endian. */
struct failslow_record {
    uint64_t seq;          /*   0 commit stamp: seq (1-based) when committed, seq|BUSY while written */
    uint64_t comm;         /*   8 stable communicator id */
    uint64_t count;        /*  16 element count */
    uint64_t bytes;        /*  24 payload bytes (count * dtype size) */
    int64_t t_enqueue_ns;  /*  32 host time at call entry */
    int64_t t_start_ns;    /*  40 start (host or GPU, see flags), 0 = unknown */
    int64_t t_end_ns;      /*  48 end (host or GPU, see flags), 0 = unknown */
    int64_t t_return_ns;   /*  56 host time when the hooked call returned to the caller */
    int32_t nranks;        /*  64 communicator size */
    int32_t comm_rank;     /*  68 this process's rank in the communicator */
    int32_t peer;          /*  72 peer (send/recv) or root (bcast/reduce/gather/scatter), -1 otherwise */
    uint16_t op;           /*  76 enum failslow_op */
    uint8_t dtype;         /*  78 ncclDataType_t or 255 */
    uint8_t group_depth;   /*  79 ncclGroupStart nesting depth at the call */
    uint32_t flags;        /*  80 FAILSLOW_F_* */
    uint32_t tid;          /*  84 OS thread id (low 32 bits) of the caller */
    uint64_t stream;       /*  88 cudaStream_t value (0 for host backends) */
    uint64_t aux;          /*  96 op-specific: parent comm id for COMM_SPLIT */
    int32_t device;        /* 104 CUDA device of the communicator, -1 unknown */
    uint32_t reserved0;    /* 108 zero */
    uint64_t reserved1;    /* 112 zero */
    uint64_t reserved2;    /* 120 zero */
};

struct failslow_ring_header {
    char magic[8];            /*    0 "FSLRING\0" */
    uint32_t version;         /*    8 FAILSLOW_RING_VERSION */
    uint32_t header_size;     /*   12 FAILSLOW_RING_HEADER_SIZE */
    uint32_t record_size;     /*   16 FAILSLOW_RECORD_SIZE */
    uint32_t capacity;        /*   20 records, power of two */
    int32_t pid;              /*   24 producer process */
    int32_t rank;             /*   28 global rank, -1 unknown */
    int32_t world_size;       /*   32 0 unknown */
    int32_t local_rank;       /*   36 -1 unknown */
    int32_t tp;               /*   40 parallel layout sizes, 0 unknown */
    int32_t pp;               /*   44 */
    int32_t dp;               /*   48 */
    int32_t cp;               /*   52 */
    int32_t node_id;          /*   56 -1 unknown */
    uint32_t producer;        /*   60 FAILSLOW_PRODUCER_* */
    int64_t clock_offset_ns;  /*   64 CLOCK_REALTIME - CLOCK_MONOTONIC at creation */
    int64_t created_mono_ns;  /*   72 CLOCK_MONOTONIC at creation */
    char job[64];             /*   80 job id, NUL-terminated (truncated) */
    char hostname[64];        /*  144 NUL-terminated (truncated) */
    uint32_t features;        /*  208 FAILSLOW_FEAT_* */
    uint32_t clock_source;    /*  212 FAILSLOW_CLOCK_* (was reserved, zero = monotonic) */
    uint8_t pad0[40];         /*  216 */
    uint64_t write_index;     /*  256 records claimed so far (own cache line: the hot counter) */
    uint8_t pad1[56];         /*  264 */
    uint64_t dropped;         /*  320 records the writer gave up on (slot busy after a full wrap) */
    uint64_t overwritten;     /*  328 records overwritten by the ring wrapping: write_index - capacity */
    uint8_t pad2[48];         /*  336 */
    uint32_t control;         /*  384 FAILSLOW_CTL_* (own cache line: written by controllers) */
    uint32_t suspend_timeout_ms; /* 388 max wait per call while SUSPEND is set; 0 = producer default */
    uint32_t suspended;       /*  392 threads currently held by SUSPEND */
    uint32_t reserved1;       /*  396 */
    uint8_t pad3[3696];       /*  400 .. 4096 */
};

#define FAILSLOW_STATIC_ASSERT(c, m) _Static_assert(c, m)
FAILSLOW_STATIC_ASSERT(sizeof(struct failslow_record) == FAILSLOW_RECORD_SIZE, "record size");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_record, seq) == 0, "seq first");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_record, nranks) == 64, "record offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_record, flags) == 80, "record offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_record, device) == 104, "record offsets");
FAILSLOW_STATIC_ASSERT(sizeof(struct failslow_ring_header) == FAILSLOW_RING_HEADER_SIZE, "header size");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, job) == 80, "header offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, features) == 208, "header offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, write_index) == 256, "header offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, dropped) == 320, "header offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, control) == 384, "header offsets");
FAILSLOW_STATIC_ASSERT(offsetof(struct failslow_ring_header, reserved1) == 396, "header offsets");

static inline struct failslow_record *failslow_ring_records(struct failslow_ring_header *h) {
    return (struct failslow_record *)((char *)h + FAILSLOW_RING_HEADER_SIZE);
}

/*
 * Writer side. Claim a slot; returns the record to fill (stamp already seq|BUSY) and stores its seq in *seq,
 * or NULL when the record must be given up (counted in header.dropped). Never blocks, never allocates.
 */
static inline struct failslow_record *failslow_ring_claim(struct failslow_ring_header *h, uint64_t *seq) {
    uint64_t s = __atomic_add_fetch(&h->write_index, 1, __ATOMIC_RELAXED);
    struct failslow_record *r = failslow_ring_records(h) + ((s - 1) & (uint64_t)(h->capacity - 1));
    uint64_t old = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    for (;;) {
        if ((old & FAILSLOW_STAMP_BUSY) || old >= s) {
            __atomic_add_fetch(&h->dropped, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        if (__atomic_compare_exchange_n(&r->seq, &old, s | FAILSLOW_STAMP_BUSY, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            break;
    }
    /* the BUSY stamp must be visible before any payload store */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* a plain store, not a locked add, keeps the hot path at two atomic RMWs; with one writer thread it is
     * exact, with several it may briefly lag by the records in flight */
    if (old != 0 && s > h->capacity) __atomic_store_n(&h->overwritten, s - h->capacity, __ATOMIC_RELAXED);
    *seq = s;
    return r;
}

/* Writer side: publish a claimed record (payload first, stamp last with release). */
static inline void failslow_ring_commit(struct failslow_record *r, uint64_t seq) {
    __atomic_store_n(&r->seq, seq, __ATOMIC_RELEASE);
}

/* Reader side results of failslow_ring_try_read. */
#define FAILSLOW_READ_OK 0
#define FAILSLOW_READ_LOST 1    /* overwritten by a newer record */
#define FAILSLOW_READ_PENDING 2 /* claimed but not committed yet */

/* Reader side: copy the record with sequence `e` into *out if it is committed and intact. */
static inline int failslow_ring_try_read(struct failslow_ring_header *h, uint64_t e, struct failslow_record *out) {
    struct failslow_record *r = failslow_ring_records(h) + ((e - 1) & (uint64_t)(h->capacity - 1));
    uint64_t s1 = __atomic_load_n(&r->seq, __ATOMIC_ACQUIRE);
    if ((s1 & ~FAILSLOW_STAMP_BUSY) > e) return FAILSLOW_READ_LOST;
    if (s1 != e) return FAILSLOW_READ_PENDING;
    __builtin_memcpy(out, (const void *)r, sizeof *out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t s2 = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    if (s2 != e) return (s2 & ~FAILSLOW_STAMP_BUSY) > e ? FAILSLOW_READ_LOST : FAILSLOW_READ_PENDING;
    out->seq = e;
    return FAILSLOW_READ_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* FAILSLOW_RING_H */
