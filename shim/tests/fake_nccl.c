/*
 * A stand-in libnccl.so.2 for the shim's tests: NCCL's public C ABI (nccl_abi.h), no GPU. Each call can
 * spin for FAKE_NCCL_DELAY_NS nanoseconds (the host-side cost of a real enqueue, or a slow call), counts
 * itself (fake_nccl_calls), and sends to peer FAKE_NCCL_FAIL_PEER fail with ncclRemoteError. ncclBcast
 * calls ncclBroadcast through the PLT, as real NCCL may, so nested interposition is exercised.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_abi.h"

#define API __attribute__((visibility("default")))

struct ncclComm {
    int nranks, rank, dev;
};

static long g_calls;
static long g_delay_ns = -1;
static int g_fail_peer = -2;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void work(void) {
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    if (g_delay_ns < 0) {
        const char *d = getenv("FAKE_NCCL_DELAY_NS");
        g_delay_ns = d ? atol(d) : 0;
        const char *f = getenv("FAKE_NCCL_FAIL_PEER");
        g_fail_peer = f ? atoi(f) : -2;
    }
    if (g_delay_ns > 0) {
        int64_t end = now_ns() + g_delay_ns;
        while (now_ns() < end) {
        }
    }
}

API long fake_nccl_calls(void) { return __atomic_load_n(&g_calls, __ATOMIC_RELAXED); }

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id->internal[i] = (char)(rand() & 0xff);
    return ncclSuccess;
}

static ncclResult_t mk(ncclComm_t *comm, int nranks, int rank, int dev) {
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    struct ncclComm *c = malloc(sizeof *c);
    if (!c) return ncclSystemError;
    c->nranks = nranks;
    c->rank = rank;
    c->dev = dev;
    *comm = c;
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    return mk(comm, nranks, rank, rank % 8);
}
API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    (void)cfg;
    return ncclCommInitRank(comm, nranks, id, rank);
}
API ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId, ncclUniqueId *ids,
                                          ncclConfig_t *cfg) {
    (void)nId, (void)ids, (void)cfg;
    return mk(comm, nranks, rank, rank % 8);
}
API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    for (int i = 0; i < ndev; i++) {
        ncclResult_t r = mk(&comms[i], ndev, i, devlist ? devlist[i] : i);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}
API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *cfg) {
    (void)cfg;
    if (color == NCCL_SPLIT_NOCOLOR) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    int n = (comm->nranks + 1) / 2;
    return mk(newcomm, n, key % n, comm->dev);
}
API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}
API ncclResult_t ncclCommAbort(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}
API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    *count = comm->nranks;
    return ncclSuccess;
}
API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    *rank = comm->rank;
    return ncclSuccess;
}
API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *dev) {
    *dev = comm->dev;
    return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c,
                               cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)o, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c,
                                   cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)o, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)root, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclBcast(void *b, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    return ncclBroadcast(b, b, n, t, root, c, st); /* through the PLT: interposable */
}
API ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, int root,
                            ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)o, (void)root, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)c, (void)st;
    work();
    return ncclSuccess;
}
API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)n, (void)t, (void)c, (void)st;
    work();
    return peer == g_fail_peer ? ncclRemoteError : ncclSuccess;
}
API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)r, (void)n, (void)t, (void)peer, (void)c, (void)st;
    work();
    return ncclSuccess;
}
static __thread int g_group;
API ncclResult_t ncclGroupStart(void) {
    g_group++;
    return ncclSuccess;
}
API ncclResult_t ncclGroupEnd(void) {
    if (g_group <= 0) return ncclInvalidUsage;
    g_group--;
    return ncclSuccess;
}
