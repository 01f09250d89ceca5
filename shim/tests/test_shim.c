/*
 * C tests of libfailslow_shim.so, run under LD_PRELOAD against the stand-in libnccl (tests/fake_nccl.c).
 * One mode per process (`test_shim MODE`), driven by tests/run_tests.sh. Each mode checks its own ring
 * with the reader of failslow_ring.h and exits non-zero with a message on the first failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "nccl_abi.h"

static const char *g_mode = "?";

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "FAIL [%s] %s:%d: %s: ", g_mode, __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Record times come from the shim's clock: CLOCK_MONOTONIC itself, or the TSC mapped onto it, which may
 * sit this far either side of a clock_gettime bracket (docs/shim.md derives the bound; measured: < 100 ns). */
#define CLOCK_TOL_NS 5000LL

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* --- ring access ------------------------------------------------------------------------------- */

static const char *shim_ring_path(void) {
    const char *(*fn)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_ring_path");
    CHECK(fn != NULL, "libfailslow_shim.so is not preloaded (LD_PRELOAD)");
    return fn();
}

static long fake_calls(void) {
    long (*fn)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "fake_nccl_calls");
    CHECK(fn != NULL, "stand-in libnccl not loaded");
    return fn();
}

static struct failslow_ring_header *map_ring(const char *path) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(m != MAP_FAILED, "mmap");
    struct failslow_ring_header *h = m;
    CHECK(memcmp(h->magic, FAILSLOW_RING_MAGIC, 8) == 0, "magic");
    CHECK((size_t)st.st_size == FAILSLOW_RING_HEADER_SIZE + (size_t)h->capacity * FAILSLOW_RECORD_SIZE, "size");
    return h;
}

struct readout {
    struct failslow_record *recs;
    size_t n, lost, pending;
};

/* Read everything still in the ring; pending records count as lost when `dead` (producer gone). */
static struct readout read_all(struct failslow_ring_header *h, int dead) {
    struct readout o = {0};
    uint64_t w = __atomic_load_n(&h->write_index, __ATOMIC_ACQUIRE);
    uint64_t start = w > h->capacity ? w - h->capacity + 1 : 1;
    o.recs = calloc(h->capacity + 1, sizeof *o.recs);
    for (uint64_t e = start; e <= w; e++) {
        int rc = failslow_ring_try_read(h, e, &o.recs[o.n]);
        if (rc == FAILSLOW_READ_OK)
            o.n++;
        else if (rc == FAILSLOW_READ_LOST || dead)
            o.lost++;
        else
            o.pending++;
    }
    return o;
}

static ncclComm_t init_comm(int nranks, int rank, unsigned char pattern) {
    ncclUniqueId id;
    memset(id.internal, pattern, sizeof id.internal);
    ncclComm_t c = NULL;
    CHECK(ncclCommInitRank(&c, nranks, id, rank) == ncclSuccess, "init");
    return c;
}

/* --- basic: every hooked op, groups, nesting, lifecycle, errors --------------------------------- */

static int mode_basic(void) {
    CHECK(strcmp(shim_ring_path(), "") == 0, "no ring before the first NCCL call");
    ncclComm_t c = init_comm(4, 2, 0xAB);
    const char *path = shim_ring_path();
    CHECK(*path, "ring created at init");
    struct failslow_ring_header *h = map_ring(path);
    CHECK(h->pid == getpid() && h->producer == FAILSLOW_PRODUCER_SHIM, "header identity");
    CHECK(h->rank == 5 && h->world_size == 8 && h->tp == 2 && h->pp == 4 && h->dp == 1, "env identity");
    CHECK(strcmp(h->job, "shimtest") == 0, "job %s", h->job);
    long calls0 = fake_calls();
    int64_t t_before = now_ns();
    void *stream = (void *)0x1234;
    CHECK(ncclAllReduce(0, 0, 1000, ncclFloat32, ncclSum, c, stream) == ncclSuccess, "allreduce");
    CHECK(ncclAllGather(0, 0, 10, ncclBfloat16, c, stream) == ncclSuccess, "allgather");
    CHECK(ncclReduceScatter(0, 0, 20, ncclFloat64, ncclSum, c, stream) == ncclSuccess, "rs");
    CHECK(ncclBroadcast(0, 0, 30, ncclInt8, 1, c, stream) == ncclSuccess, "bcast");
    CHECK(ncclBcast(0, 40, ncclInt32, 3, c, stream) == ncclSuccess, "legacy bcast (nests ncclBroadcast)");
    CHECK(ncclReduce(0, 0, 50, ncclFloat16, ncclMax, 0, c, stream) == ncclSuccess, "reduce");
    CHECK(ncclAlltoAll(0, 0, 60, ncclUint8, c, stream) == ncclSuccess, "alltoall");
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclSend(0, 70, ncclFloat32, 3, c, stream) == ncclSuccess, "send");
    CHECK(ncclRecv(0, 80, ncclFloat32, 1, c, stream) == ncclSuccess, "recv");
    CHECK(ncclGroupEnd() == ncclSuccess, "group end");
    CHECK(ncclSend(0, 1, ncclFloat32, 2, c, stream) == ncclRemoteError, "the real error reaches the caller");
    int64_t t_after = now_ns();
    CHECK(fake_calls() - calls0 == 10, "each call reached NCCL exactly once (%ld)", fake_calls() - calls0);
    ncclComm_t sub = NULL, none = (ncclComm_t)0x1;
    CHECK(ncclCommSplit(c, 7, 3, &sub, NULL) == ncclSuccess && sub, "split");
    CHECK(ncclCommSplit(c, NCCL_SPLIT_NOCOLOR, 0, &none, NULL) == ncclSuccess && none == NULL, "nocolor split");
    CHECK(ncclAllReduce(0, 0, 5, ncclFloat32, ncclSum, sub, stream) == ncclSuccess, "allreduce on split");
    CHECK(ncclCommDestroy(sub) == ncclSuccess, "destroy");
    ncclComm_t all[3];
    CHECK(ncclCommInitAll(all, 3, NULL) == ncclSuccess, "initall");
    CHECK(ncclAllReduce(0, 0, 9, ncclFloat32, ncclSum, all[1], stream) == ncclSuccess, "allreduce initall");

    struct readout o = read_all(h, 0);
    CHECK(o.lost == 0 && o.pending == 0, "lost %zu pending %zu", o.lost, o.pending);
    /* init, 10 calls, split, split(nocolor), allreduce, destroy, 3 inits, allreduce */
    CHECK(o.n == 19, "records %zu", o.n);
    struct failslow_record *r = o.recs;
    for (size_t i = 0; i < o.n; i++) CHECK(r[i].seq == i + 1, "seq %zu", i);
    CHECK(r[0].op == FAILSLOW_OP_COMM_INIT && r[0].nranks == 4 && r[0].comm_rank == 2 && r[0].device == 2,
          "init event");
    uint64_t cid = r[0].comm;
    struct { int op; uint64_t count, bytes; int peer, dtype; } exp[] = {
        {FAILSLOW_OP_ALLREDUCE, 1000, 4000, -1, ncclFloat32}, {FAILSLOW_OP_ALLGATHER, 10, 20, -1, ncclBfloat16},
        {FAILSLOW_OP_REDUCESCATTER, 20, 160, -1, ncclFloat64}, {FAILSLOW_OP_BROADCAST, 30, 30, 1, ncclInt8},
        {FAILSLOW_OP_BROADCAST, 40, 160, 3, ncclInt32}, {FAILSLOW_OP_REDUCE, 50, 100, 0, ncclFloat16},
        {FAILSLOW_OP_ALLTOALL, 60, 60, -1, ncclUint8}, {FAILSLOW_OP_SEND, 70, 280, 3, ncclFloat32},
        {FAILSLOW_OP_RECV, 80, 320, 1, ncclFloat32}, {FAILSLOW_OP_SEND, 1, 4, 2, ncclFloat32}};
    for (int i = 0; i < 10; i++) {
        struct failslow_record *x = &r[1 + i];
        CHECK(x->op == exp[i].op, "op %d: %u", i, x->op);
        CHECK(x->count == exp[i].count && x->bytes == exp[i].bytes, "count/bytes %d: %lu %lu", i,
              (unsigned long)x->count, (unsigned long)x->bytes);
        CHECK(x->peer == exp[i].peer && x->dtype == exp[i].dtype, "peer/dtype %d: %d %u", i, x->peer, x->dtype);
        CHECK(x->comm == cid && x->nranks == 4 && x->comm_rank == 2 && x->device == 2, "comm facts %d", i);
        CHECK(x->stream == 0x1234 && x->tid != 0, "stream/tid %d", i);
        CHECK(t_before - CLOCK_TOL_NS <= x->t_enqueue_ns && x->t_enqueue_ns <= x->t_return_ns &&
                  x->t_return_ns <= t_after + CLOCK_TOL_NS,
              "host times %d", i);
        CHECK(i == 0 || x->t_enqueue_ns >= r[i].t_return_ns, "host times in call order %d", i);
        CHECK(x->t_start_ns == 0 && x->t_end_ns == 0, "no GPU times without PROFILE %d", i);
        int in_group = (i == 7 || i == 8);
        CHECK(!!(x->flags & FAILSLOW_F_IN_GROUP) == in_group && x->group_depth == (in_group ? 1 : 0),
              "group flag %d", i);
        CHECK(!!(x->flags & FAILSLOW_F_ERROR) == (i == 9), "error flag %d", i);
        CHECK(x->flags & FAILSLOW_F_HOST_TIMES, "host flag %d", i);
    }
    struct failslow_record *sp = &r[11], *nc = &r[12], *sar = &r[13], *de = &r[14];
    CHECK(sp->op == FAILSLOW_OP_COMM_SPLIT && sp->aux == cid && sp->peer == 7 && sp->count == 3 &&
              sp->nranks == 2 && sp->comm_rank == 1 && sp->comm != cid && sp->comm != 0,
          "split event");
    CHECK(nc->op == FAILSLOW_OP_COMM_SPLIT && nc->comm == 0 && nc->peer == NCCL_SPLIT_NOCOLOR, "nocolor event");
    CHECK(sar->op == FAILSLOW_OP_ALLREDUCE && sar->comm == sp->comm && sar->nranks == 2, "split comm facts");
    CHECK(de->op == FAILSLOW_OP_COMM_DESTROY && de->comm == sp->comm, "destroy event");
    CHECK(r[15].op == FAILSLOW_OP_COMM_INIT && r[16].comm == r[15].comm && r[17].comm == r[15].comm &&
              r[17].comm_rank == 2 && r[15].nranks == 3,
          "initall events share one id");
    CHECK(r[18].comm == r[15].comm && r[18].comm_rank == 1, "initall comm facts");
    /* the same unique id gives the same id in another "rank"; a different one does not */
    ncclComm_t c2 = init_comm(4, 3, 0xAB), c3 = init_comm(4, 0, 0xAC);
    struct readout o2 = read_all(h, 0);
    CHECK(o2.recs[o2.n - 2].comm == cid && o2.recs[o2.n - 2].comm_rank == 3, "same unique id, same comm id");
    CHECK(o2.recs[o2.n - 1].comm != cid, "different unique id, different comm id");
    /* InitRankScalable: the id hashes all the unique ids, so two ranks given the same set agree */
    ncclUniqueId ids[2];
    memset(ids[0].internal, 0x31, sizeof ids[0].internal);
    memset(ids[1].internal, 0x32, sizeof ids[1].internal);
    ncclComm_t s1 = NULL, s2 = NULL;
    CHECK(ncclCommInitRankScalable(&s1, 16, 3, 2, ids, NULL) == ncclSuccess, "scalable init");
    CHECK(ncclCommInitRankScalable(&s2, 16, 9, 2, ids, NULL) == ncclSuccess, "scalable init");
    CHECK(ncclCommAbort(c3) == ncclSuccess, "abort");
    struct readout o3 = read_all(h, 0);
    struct failslow_record *q = o3.recs + o3.n - 3;
    CHECK(q[0].op == FAILSLOW_OP_COMM_INIT && q[1].op == FAILSLOW_OP_COMM_INIT && q[0].comm == q[1].comm &&
              q[0].comm != cid && q[0].nranks == 16 && q[0].comm_rank == 3 && q[1].comm_rank == 9,
          "scalable init events");
    CHECK(q[2].op == FAILSLOW_OP_COMM_ABORT && q[2].comm == o2.recs[o2.n - 1].comm, "abort event");
    CHECK(h->dropped == 0 && h->overwritten == 0, "counters");
    (void)c2;
    printf("basic: %zu records checked\n", o.n);
    return 0;
}

/* --- threads: many writers and a concurrent reader never see a torn record ----------------------- */

#define NTHREADS 8
static ncclComm_t g_tcomm[NTHREADS];
static long g_per_thread = 20000;
static volatile int g_stop_reader;

static void *writer(void *arg) {
    long t = (long)arg;
    for (long i = 0; i < g_per_thread; i++) {
        /* every field is derived from (t, i) so a reader can check a record is whole */
        ncclAllReduce(0, 0, (size_t)(t * 1000000 + i), ncclFloat32, ncclSum, g_tcomm[t], (void *)(t + 1));
    }
    return NULL;
}

static int check_record(const struct failslow_record *x, uint64_t *comm_of) {
    if (x->op == FAILSLOW_OP_COMM_INIT) return 1;
    long t = (long)(x->count / 1000000);
    if (x->op != FAILSLOW_OP_ALLREDUCE || t < 0 || t >= NTHREADS) return 0;
    return x->bytes == x->count * 4 && x->stream == (uint64_t)(t + 1) && x->comm == comm_of[t] &&
           x->comm_rank == (int)t && x->nranks == NTHREADS && x->t_enqueue_ns <= x->t_return_ns;
}

static struct failslow_ring_header *g_th;
static uint64_t g_comm_ids[NTHREADS];
static size_t g_reader_ok, g_reader_bad;

static void *reader(void *arg) {
    (void)arg;
    struct failslow_record rec;
    uint64_t next = 1;
    while (!g_stop_reader) {
        uint64_t w = __atomic_load_n(&g_th->write_index, __ATOMIC_ACQUIRE);
        if (w >= next + g_th->capacity) next = w - g_th->capacity + 1;
        for (; next <= w; next++) {
            int rc = failslow_ring_try_read(g_th, next, &rec);
            if (rc == FAILSLOW_READ_PENDING) break;
            if (rc == FAILSLOW_READ_OK) {
                if (check_record(&rec, g_comm_ids)) g_reader_ok++;
                else g_reader_bad++;
            }
        }
    }
    return NULL;
}

static int mode_threads(void) {
    for (int t = 0; t < NTHREADS; t++) g_tcomm[t] = init_comm(NTHREADS, t, (unsigned char)(0x10 + t));
    g_th = map_ring(shim_ring_path());
    CHECK(g_th->capacity == 4096, "capacity from FAILSLOW_RING_CAPACITY (%u)", g_th->capacity);
    struct readout o0 = read_all(g_th, 0);
    CHECK(o0.n == NTHREADS, "init events");
    for (int t = 0; t < NTHREADS; t++) g_comm_ids[t] = o0.recs[t].comm;
    pthread_t th[NTHREADS], rd;
    pthread_create(&rd, NULL, reader, NULL);
    for (long t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, writer, (void *)t);
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    g_stop_reader = 1;
    pthread_join(rd, NULL);
    uint64_t total = NTHREADS + (uint64_t)NTHREADS * (uint64_t)g_per_thread;
    /* every call took its own sequence number (fetch-add): none lost, none handed out twice */
    CHECK(g_th->write_index == total, "write index %lu of %lu calls (dropped %lu)", (unsigned long)g_th->write_index,
          (unsigned long)total, (unsigned long)g_th->dropped);
    CHECK(g_reader_bad == 0, "concurrent reader saw %zu torn/garbled records", g_reader_bad);
    CHECK(g_reader_ok > 0, "concurrent reader read nothing");
    /* at rest every claimed slot is final: a slot that still shows an older stamp belongs to a record a
     * writer gave up on (counted in `dropped`), so read it as lost */
    struct readout o = read_all(g_th, 1);
    CHECK(o.n + o.lost == g_th->capacity, "ring holds capacity records (%zu + %zu)", o.n, o.lost);
    CHECK(o.lost <= g_th->dropped, "records missing at rest are writer-side drops (%zu vs %lu)", o.lost,
          (unsigned long)g_th->dropped);
    CHECK(g_th->overwritten + g_th->dropped >= total - g_th->capacity, "overflow counted");
    long last[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) last[t] = -1;
    for (size_t i = 0; i < o.n; i++) {
        CHECK(check_record(&o.recs[i], g_comm_ids), "record %zu whole", i);
        long t = (long)(o.recs[i].count / 1000000), k = (long)(o.recs[i].count % 1000000);
        CHECK(k > last[t], "per-thread order preserved");
        last[t] = k;
    }
    printf("threads: %d writers x %ld calls, concurrent reader checked %zu records, dropped %lu, overwritten %lu\n",
           NTHREADS, g_per_thread, g_reader_ok, (unsigned long)g_th->dropped, (unsigned long)g_th->overwritten);
    return 0;
}

/* --- overflow: a small ring keeps the newest records and counts the rest ------------------------ */

static int mode_overflow(void) {
    ncclComm_t c = init_comm(2, 0, 1);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    CHECK(h->capacity == 64, "capacity %u", h->capacity);
    for (int i = 0; i < 1000; i++) ncclAllReduce(0, 0, (size_t)i, ncclFloat32, ncclSum, c, 0);
    struct readout o = read_all(h, 0);
    CHECK(h->write_index == 1001 && o.n == 64 && o.lost == 0, "newest 64 kept (%zu)", o.n);
    CHECK(h->overwritten == 1001 - 64 && h->dropped == 0, "overwritten %lu", (unsigned long)h->overwritten);
    for (int i = 0; i < 64; i++) CHECK(o.recs[i].count == (uint64_t)(1000 - 64 + i), "oldest overwritten first");
    printf("overflow: ok\n");
    return 0;
}

/* --- fork: the child records into its own ring --------------------------------------------------- */

/* --- handover: one thread's plain claims end exactly when a second thread starts writing -------- */
/* Each round is a forked child (a fresh process: nobody owns its ring yet). The main thread makes the
 * first call, so it owns the ring and writes with plain loads and stores; a second
 * thread starts writing while the owner is in full flow, at a different point each round. Whatever the
 * interleaving, every call must get its own sequence number (write_index == calls, nothing dropped) and
 * every record must be whole, in call order per thread. */
#define HO_ROUNDS 150
#define HO_CALLS 4000
static ncclComm_t g_ho_comm[2];
static volatile long g_ho_progress, g_ho_start_at;

static void *ho_second(void *arg) {
    (void)arg;
    while (g_ho_progress < g_ho_start_at) {
    }
    for (long i = 0; i < HO_CALLS; i++)
        ncclAllReduce(0, 0, (size_t)(1000000 + i), ncclFloat32, ncclSum, g_ho_comm[1], (void *)2);
    return NULL;
}

static int claim_stats(int64_t *st) {
    int (*fn)(int64_t *, int) = (int (*)(int64_t *, int))dlsym(RTLD_DEFAULT, "failslow_shim_claim_stats");
    CHECK(fn != NULL, "failslow_shim_claim_stats not exported");
    return fn(st, 5);
}

static int ho_child(long start_at) {
    g_ho_comm[0] = init_comm(2, 0, 0x31);
    g_ho_comm[1] = init_comm(2, 1, 0x32);
    int64_t st[5];
    claim_stats(st);
    const char *want = getenv("EXPECT_SINGLE_WRITER");
    int single = !(want && strcmp(want, "0") == 0);
    CHECK(st[1] == single, "single-writer path allowed: %lld, expected %d (membarrier?)", (long long)st[1], single);
    CHECK(st[0] == 0, "control events make no owner (owner %lld)", (long long)st[0]);
    ncclAllReduce(0, 0, 0, ncclFloat32, ncclSum, g_ho_comm[0], (void *)1);
    claim_stats(st);
    CHECK(!single || st[0] == (int64_t)syscall(SYS_gettid), "the first caller owns the ring (owner %lld)",
          (long long)st[0]);
    CHECK(st[2] == !single, "not contended before a second thread writes");
    g_ho_start_at = start_at;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, ho_second, NULL) == 0, "thread");
    for (long i = 0; i < HO_CALLS; i++) {
        ncclAllReduce(0, 0, (size_t)i, ncclFloat32, ncclSum, g_ho_comm[0], (void *)1);
        g_ho_progress = i;
    }
    pthread_join(th, NULL);
    claim_stats(st);
    CHECK(st[2] == 1 && st[3] == 1, "a second writer ends the plain claims (contended %lld, done %lld)",
          (long long)st[2], (long long)st[3]);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    uint64_t total = 2 + 2 * (uint64_t)HO_CALLS + 1;
    CHECK(h->write_index == total && h->dropped == 0, "write index %lu of %lu calls, dropped %lu",
          (unsigned long)h->write_index, (unsigned long)total, (unsigned long)h->dropped);
    struct readout o = read_all(h, 1);
    CHECK(o.n == total && o.lost == 0, "every record readable (%zu of %lu, %zu lost)", o.n, (unsigned long)total,
          o.lost);
    long last[2] = {-1, -1};
    for (size_t i = 0; i < o.n; i++) {
        const struct failslow_record *x = &o.recs[i];
        CHECK(x->seq == i + 1, "record %zu carries sequence %lu", i, (unsigned long)x->seq);
        if (x->op == FAILSLOW_OP_COMM_INIT || i == 2) continue; /* the inits, the owner's first call */
        int t = x->count >= 1000000;
        long k = (long)(x->count % 1000000);
        CHECK(x->op == FAILSLOW_OP_ALLREDUCE && x->stream == (uint64_t)(t + 1) && x->bytes == x->count * 4 &&
                  x->comm == o.recs[t].comm && x->comm_rank == t && x->t_enqueue_ns <= x->t_return_ns,
              "record %zu whole", i);
        CHECK(k == last[t] + 1, "thread %d: call %ld follows %ld", t, k, last[t]);
        last[t] = k;
    }
    return (int)(st[4] > 0); /* 1: this round's handover found the owner inside a plain claim */
}

static int mode_handover(void) {
    int waited = 0;
    for (int r = 0; r < HO_ROUNDS; r++) {
        int fds[2];
        CHECK(pipe(fds) == 0, "pipe");
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            char w = (char)('0' + ho_child((long)(r * 997 % (HO_CALLS / 2))));
            ssize_t n = write(fds[1], &w, 1);
            unlink(shim_ring_path());
            _exit(n == 1 ? 0 : 1);
        }
        close(fds[1]);
        char w = 0;
        ssize_t n = read(fds[0], &w, 1);
        close(fds[0]);
        int stt;
        waitpid(pid, &stt, 0);
        CHECK(WIFEXITED(stt) && WEXITSTATUS(stt) == 0 && n == 1, "round %d failed", r);
        waited += w == '1';
    }
    printf("handover: %d rounds x 2 threads x %d calls exact; %d handovers found the owner mid-claim and waited\n",
           HO_ROUNDS, HO_CALLS, waited);
    return 0;
}

static int mode_fork(void) {
    ncclComm_t c = init_comm(2, 1, 2);
    for (int i = 0; i < 5; i++) ncclAllReduce(0, 0, 1, ncclFloat32, ncclSum, c, 0);
    char parent_path[4096];
    snprintf(parent_path, sizeof parent_path, "%s", shim_ring_path());
    struct failslow_ring_header *h = map_ring(parent_path);
    uint64_t w0 = h->write_index;
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    int64_t t_fork = now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 7; i++) ncclAllReduce(0, 0, 77, ncclFloat32, ncclSum, c, 0);
        const char *p = shim_ring_path();
        ssize_t n = write(fds[1], p, strlen(p) + 1);
        _exit(n > 0 ? 0 : 1);
    }
    char child_path[4096] = {0};
    CHECK(read(fds[0], child_path, sizeof child_path - 1) > 0, "child path");
    int st;
    waitpid(pid, &st, 0);
    int64_t t_done = now_ns();
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child ok");
    char want[64];
    snprintf(want, sizeof want, "failslow-%d.ring", (int)pid);
    CHECK(strstr(child_path, want) != NULL, "child ring named by its pid: %s", child_path);
    CHECK(h->write_index == w0, "parent ring untouched by the child");
    struct failslow_ring_header *ch = map_ring(child_path);
    struct readout o = read_all(ch, 1);
    CHECK(ch->pid == pid && o.n == 7, "child ring: pid %d records %zu", ch->pid, o.n);
    for (size_t i = 0; i < o.n; i++) CHECK(o.recs[i].count == 77 && o.recs[i].comm == read_all(h, 0).recs[0].comm,
                                          "child records carry the inherited comm id");
    /* the child inherits the clock calibration (same counter): its times are still CLOCK_MONOTONIC */
    for (size_t i = 0; i < o.n; i++)
        CHECK(o.recs[i].t_enqueue_ns >= t_fork - CLOCK_TOL_NS && o.recs[i].t_return_ns <= t_done + CLOCK_TOL_NS &&
                  (i == 0 || o.recs[i].t_enqueue_ns >= o.recs[i - 1].t_return_ns),
              "child record %zu time", i);
    unlink(child_path);
    printf("fork: ok\n");
    return 0;
}

/* --- killed: a process dies with records mid-write; the reader stays consistent ------------------ */

static void *spin_writer(void *arg) {
    long t = (long)arg;
    for (long i = 0;; i++) ncclAllReduce(0, 0, (size_t)(t * 1000000 + (i % 1000000)), ncclFloat32, ncclSum, g_tcomm[t],
                                         (void *)(t + 1));
    return NULL;
}

static int mode_killed(void) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        for (int t = 0; t < NTHREADS; t++) g_tcomm[t] = init_comm(NTHREADS, t, (unsigned char)(0x10 + t));
        const char *p = shim_ring_path();
        if (write(fds[1], p, strlen(p) + 1) <= 0) _exit(2);
        pthread_t th[NTHREADS];
        for (long t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, spin_writer, (void *)t);
        sleep_ms(150);
        raise(SIGKILL); /* whatever each thread was doing, it stops mid-way */
        _exit(3);
    }
    char path[4096] = {0};
    CHECK(read(fds[0], path, sizeof path - 1) > 0, "child path");
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child killed");
    struct failslow_ring_header *h = map_ring(path); /* kept: the child never ran its exit handlers */
    uint64_t w = h->write_index;
    CHECK(w > NTHREADS, "child wrote (%lu)", (unsigned long)w);
    struct readout o = read_all(h, 1);
    size_t bad = 0;
    uint64_t ids[NTHREADS] = {0};
    int have_ids = 0;
    for (size_t i = 0; i < o.n && o.recs[i].op == FAILSLOW_OP_COMM_INIT; i++) {
        ids[o.recs[i].comm_rank] = o.recs[i].comm;
        have_ids++;
    }
    for (size_t i = 0; i < o.n; i++) {
        if (o.recs[i].op == FAILSLOW_OP_COMM_INIT) continue;
        if (have_ids == NTHREADS ? !check_record(&o.recs[i], ids)
                                 : (o.recs[i].bytes != o.recs[i].count * 4 || o.recs[i].op != FAILSLOW_OP_ALLREDUCE))
            bad++;
    }
    CHECK(bad == 0, "%zu garbled records", bad);
    CHECK(o.n + o.lost == (w < h->capacity ? w : h->capacity), "every slot accounted for");
    unlink(path);
    printf("killed: %lu claimed, %zu read intact, %zu lost mid-write or dropped\n", (unsigned long)w, o.n, o.lost);
    return 0;
}

/* --- suspend: the control word holds calls, bounded ---------------------------------------------- */

static ncclComm_t g_scomm;
static volatile int g_call_done;

static void *one_call(void *arg) {
    (void)arg;
    ncclAllReduce(0, 0, 3, ncclFloat32, ncclSum, g_scomm, 0);
    __atomic_store_n(&g_call_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int mode_suspend(void) {
    g_scomm = init_comm(2, 0, 3);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    __atomic_store_n(&h->control, FAILSLOW_CTL_SUSPEND, __ATOMIC_RELEASE);
    pthread_t th;
    pthread_create(&th, NULL, one_call, NULL);
    int seen = 0;
    for (int i = 0; i < 20000 && !seen; i++) { /* generous: a loaded machine may not run the thread soon */
        seen = __atomic_load_n(&h->suspended, __ATOMIC_ACQUIRE) == 1;
        sleep_ms(1);
    }
    CHECK(seen, "the call is held and counted in header.suspended");
    sleep_ms(50);
    CHECK(!__atomic_load_n(&g_call_done, __ATOMIC_ACQUIRE), "still held while SUSPEND is set");
    __atomic_store_n(&h->control, 0, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK(h->suspended == 0, "released");
    /* a controller that never clears: the call goes on after suspend_timeout_ms */
    __atomic_store_n(&h->suspend_timeout_ms, 30, __ATOMIC_RELEASE);
    __atomic_store_n(&h->control, FAILSLOW_CTL_SUSPEND, __ATOMIC_RELEASE);
    int64_t t0 = now_ns();
    CHECK(ncclAllReduce(0, 0, 4, ncclFloat32, ncclSum, g_scomm, 0) == ncclSuccess, "timed-out call succeeds");
    CHECK(now_ns() - t0 >= 30000000LL, "waited at least the timeout");
    __atomic_store_n(&h->control, 0, __ATOMIC_RELEASE);
    struct readout o = read_all(h, 0);
    CHECK(o.n == 3, "records %zu", o.n);
    CHECK((o.recs[1].flags & FAILSLOW_F_SUSPENDED) && !(o.recs[1].flags & FAILSLOW_F_SUSPEND_TIMEOUT), "released");
    CHECK((o.recs[2].flags & FAILSLOW_F_SUSPENDED) && (o.recs[2].flags & FAILSLOW_F_SUSPEND_TIMEOUT), "timeout");
    printf("suspend: ok\n");
    return 0;
}

/* --- profile: GPU times through the stand-in libcudart, resolved asynchronously ------------------ */

static int mode_profile(void) {
    ncclComm_t c = init_comm(2, 0, 4);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    CHECK(h->features & FAILSLOW_FEAT_CUDA, "stand-in libcudart loaded (FAILSLOW_CUDART_LIB)");
    __atomic_store_n(&h->control, FAILSLOW_CTL_PROFILE, __ATOMIC_RELEASE);
    /* the resolver thread builds its event pool when it sees PROFILE: calls before that are host-only */
    const char *cudart = getenv("FAILSLOW_CUDART_LIB");
    void *ch = cudart ? dlopen(cudart, RTLD_NOW | RTLD_NOLOAD) : NULL; /* the shim loaded it RTLD_LOCAL */
    long (*recs)(void) = ch ? (long (*)(void))dlsym(ch, "fake_cuda_records") : NULL;
    CHECK(recs != NULL, "stand-in libcudart");
    /* wait until a call comes out profiled (its record left pending): the pool is ready */
    struct failslow_record r;
    int ready = 0;
    for (int i = 0; i < 400 && !ready; i++) {
        uint64_t s = h->write_index + 1;
        ncclAllReduce(0, 0, 1, ncclFloat32, ncclSum, c, 0);
        ready = failslow_ring_try_read(h, s, &r) == FAILSLOW_READ_PENDING;
        if (!ready) sleep_ms(50);
    }
    CHECK(ready, "event pool never became ready");
    long base = recs();
    uint64_t w0 = h->write_index;
    int64_t t0 = now_ns();
    for (int i = 0; i < 5; i++) CHECK(ncclAllReduce(0, 0, 10, ncclFloat32, ncclSum, c, (void *)0x77) == ncclSuccess,
                                      "call");
    long nev = recs() - base;
    CHECK(nev == 10 || nev == 11, "two events per call, plus maybe one anchor refresh (%ld)", nev);
    int rc1 = failslow_ring_try_read(h, w0 + 1, &r);
    /* the stand-in GPU runs FAKE_CUDA_LAG_NS = 400 ms behind: before that the record cannot be complete */
    if (now_ns() - t0 < 200000000LL)
        CHECK(rc1 == FAILSLOW_READ_PENDING, "record stays uncommitted until its GPU times are known");
    int done = 0;
    for (int i = 0; i < 20000 && !done; i++) {
        done = failslow_ring_try_read(h, w0 + 5, &r) == FAILSLOW_READ_OK;
        sleep_ms(1);
    }
    CHECK(done, "resolved within 20 s");
    for (uint64_t s = w0 + 1; s <= w0 + 5; s++) {
        CHECK(failslow_ring_try_read(h, s, &r) == FAILSLOW_READ_OK, "read %lu", (unsigned long)s);
        CHECK(r.flags & FAILSLOW_F_GPU_TIMES, "GPU_TIMES flag (flags %x)", r.flags);
        /* the stand-in GPU runs 400 ms behind the host; a call takes >= FAKE_NCCL_DELAY_NS = 2 ms */
        CHECK(r.t_start_ns > r.t_enqueue_ns + 200000000LL, "GPU start mapped after the enqueue");
        CHECK(r.t_end_ns - r.t_start_ns >= 2000000LL - 1000, "GPU duration covers the call (%ld)",
              (long)(r.t_end_ns - r.t_start_ns));
        CHECK(r.t_end_ns - r.t_start_ns < 2000000000LL, "sane duration");
    }
    __atomic_store_n(&h->control, 0, __ATOMIC_RELEASE);
    CHECK(ncclAllReduce(0, 0, 11, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "call");
    CHECK(failslow_ring_try_read(h, w0 + 6, &r) == FAILSLOW_READ_OK && !(r.flags & FAILSLOW_F_GPU_TIMES),
          "PROFILE off: committed at once, host times only");
    printf("profile: ok\n");
    return 0;
}

/* --- nodir: no writable ring directory: calls still work, nothing recorded ----------------------- */

static int mode_nodir(void) {
    ncclComm_t c = init_comm(2, 0, 5);
    errno = 1234;
    CHECK(ncclAllReduce(0, 0, 10, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "call passes through");
    CHECK(errno == 1234, "errno preserved");
    CHECK(strcmp(shim_ring_path(), "") == 0, "no ring");
    printf("nodir: ok\n");
    return 0;
}

/* --- full: a ring directory too small for the ring (a container's small /dev/shm) -------------------- */

static int mode_full(void) {
    ncclComm_t c = init_comm(2, 0, 6);
    long before = fake_calls();
    /* 20k records = 2.5 MiB: without the up-front reservation the writes past the tmpfs size would SIGBUS */
    for (int i = 0; i < 20000; i++)
        CHECK(ncclAllReduce(0, 0, 10, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "call passes through");
    CHECK(fake_calls() - before == 20000, "every call reached NCCL");
    CHECK(strcmp(shim_ring_path(), "") == 0, "recording turned off instead of a half-backed ring");
    printf("full: ok (no room for the ring: recording off, job unharmed)\n");
    return 0;
}

/* --- serve: a long-lived "rank" for the Python-side tests (tests/shim/): one call per stdin line ---- */

static int mode_serve(void) {
    ncclComm_t c = init_comm(4, 1, 0x5E);
    for (int i = 0; i < 10; i++) ncclAllGather(0, 0, (size_t)(100 + i), ncclBfloat16, c, (void *)0x99);
    ncclGroupStart();
    ncclSend(0, 8, ncclFloat32, 2, c, 0);
    ncclRecv(0, 8, ncclFloat32, 0, c, 0);
    ncclGroupEnd();
    printf("%s\n", shim_ring_path());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        ncclAllReduce(0, 0, (size_t)atol(line), ncclFloat32, ncclSum, c, 0);
        printf("done\n");
        fflush(stdout);
    }
    return 0;
}


/* --- clock: the shim's record clock against clock_gettime(CLOCK_MONOTONIC) ----------------------- */

typedef int64_t (*now_fn)(void);
static now_fn g_shim_now;

#define CLOCK_THREADS 4

static void *clock_thread(void *arg) {
    long t = (long)arg;
    int64_t prev = 0, worst = 0;
    for (long i = 0; i < 400000; i++) {
        int64_t a = now_ns(), x = g_shim_now(), b = now_ns();
        CHECK(x >= prev, "thread %ld: time went backwards by %lld ns at read %ld", t, (long long)(prev - x), i);
        int64_t dev = x < a ? a - x : (x > b ? x - b : 0);
        if (dev > worst) worst = dev;
        CHECK(dev <= CLOCK_TOL_NS, "thread %ld: %lld ns outside the clock_gettime bracket [%lld, %lld]", t,
              (long long)dev, (long long)a, (long long)b);
        prev = x;
        /* idle gaps of every length: within a piece, across one, and long after it */
        if (i % 50000 == 49999) sleep_ms((int)(t * 7 % 23));
        else if (i % 5000 == 4999) {
            struct timespec ts = {0, 100000L * (t + 1)};
            nanosleep(&ts, NULL);
        }
    }
    return (void *)(intptr_t)worst;
}

static int mode_clock(void) {
    const char *expect = getenv("EXPECT_CLOCK"); /* "tsc", "monotonic" or unset (whatever auto chose) */
    g_shim_now = (now_fn)dlsym(RTLD_DEFAULT, "failslow_shim_now_ns");
    const char *(*source)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_clock_source");
    int (*stats)(int64_t *, int) = (int (*)(int64_t *, int))dlsym(RTLD_DEFAULT, "failslow_shim_clock_stats");
    CHECK(g_shim_now && source && stats, "libfailslow_shim.so is not preloaded (LD_PRELOAD)");
    const char *src = source();
    CHECK(!expect || !*expect || strcmp(src, expect) == 0, "clock source %s, expected %s", src, expect);
    {
        ncclComm_t c0 = init_comm(1, 0, 0x5B); /* the ring, and its header's clock_source */
        struct failslow_ring_header *h0 = map_ring(shim_ring_path());
        CHECK(h0->clock_source == (strcmp(src, "tsc") ? FAILSLOW_CLOCK_MONOTONIC : FAILSLOW_CLOCK_TSC),
              "header clock_source %u for %s", h0->clock_source, src);
        CHECK(ncclCommDestroy(c0) == ncclSuccess, "destroy");
    }
    /* 1: many threads, each reading the shim's clock between two clock_gettime reads */
    pthread_t th[CLOCK_THREADS];
    for (long t = 0; t < CLOCK_THREADS; t++) CHECK(pthread_create(&th[t], NULL, clock_thread, (void *)t) == 0, "thread");
    int64_t worst = 0;
    for (int t = 0; t < CLOCK_THREADS; t++) {
        void *w;
        pthread_join(th[t], &w);
        if ((int64_t)(intptr_t)w > worst) worst = (int64_t)(intptr_t)w;
    }
    /* 2: records: entry/return inside the caller's bracket, in call order per thread, across idle gaps */
    ncclComm_t c = init_comm(2, 0, 0x5C);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    uint64_t first = h->write_index + 1;
    enum { CALLS = 3000 };
    static int64_t before[CALLS], after[CALLS];
    for (int i = 0; i < CALLS; i++) {
        before[i] = now_ns();
        CHECK(ncclAllReduce(0, 0, (size_t)i, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "allreduce");
        after[i] = now_ns();
        if (i % 1000 == 999) sleep_ms(3); /* the next call starts a new piece */
    }
    struct readout o = read_all(h, 0);
    size_t k = 0;
    int64_t prev = 0;
    for (size_t j = 0; j < o.n; j++) {
        struct failslow_record *x = &o.recs[j];
        if (x->seq < first || x->op != FAILSLOW_OP_ALLREDUCE) continue;
        CHECK(x->count == k, "record %zu in call order", k);
        CHECK(x->t_enqueue_ns >= before[k] - CLOCK_TOL_NS && x->t_return_ns <= after[k] + CLOCK_TOL_NS,
              "record %zu: [%lld, %lld] outside the bracket [%lld, %lld]", k, (long long)x->t_enqueue_ns,
              (long long)x->t_return_ns, (long long)before[k], (long long)after[k]);
        CHECK(x->t_enqueue_ns >= prev && x->t_return_ns >= x->t_enqueue_ns, "record %zu: monotonic", k);
        prev = x->t_return_ns;
        k++;
    }
    CHECK(k == CALLS, "records %zu", k);
    int64_t st[8] = {0};
    CHECK(stats(st, 8) == 8, "stats");
    if (!strcmp(src, "tsc")) {
        CHECK(st[3] > 0 && st[5] == 0, "re-anchors %lld, faults %lld", (long long)st[3], (long long)st[5]);
        CHECK(st[6] <= CLOCK_TOL_NS, "largest piece error %lld ns", (long long)st[6]);
    }
    printf("clock: %s, %d threads x 400000 reads: worst %lld ns outside the clock_gettime bracket; %d records "
           "in their brackets; re-anchors %lld, rate updates %lld, largest piece error %lld ns, widest anchor "
           "read %lld ns\n",
           src, CLOCK_THREADS, (long long)worst, CALLS, (long long)st[3], (long long)st[4], (long long)st[6],
           (long long)st[7]);
    return 0;
}

/* --- clockfault: a counter that disagrees with CLOCK_MONOTONIC makes the shim fall back ------------- */

static int mode_clockfault(void) {
    /* run with FAILSLOW_CLOCK=tsc FAILSLOW_CLOCK_TEST_SKEW_PPM=50000: the mapping runs 5 % fast, so each
     * 1 ms piece ends ~50 us off; after three such pieces the shim must switch to clock_gettime */
    now_fn shim_now = (now_fn)dlsym(RTLD_DEFAULT, "failslow_shim_now_ns");
    const char *(*source)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_clock_source");
    int (*stats)(int64_t *, int) = (int (*)(int64_t *, int))dlsym(RTLD_DEFAULT, "failslow_shim_clock_stats");
    CHECK(shim_now && source && stats, "libfailslow_shim.so is not preloaded (LD_PRELOAD)");
    ncclComm_t c = init_comm(1, 0, 0x5D);
    struct failslow_ring_header *h = map_ring(shim_ring_path());
    CHECK(strcmp(source(), "tsc") == 0 && h->clock_source == FAILSLOW_CLOCK_TSC, "starts on the counter");
    int64_t end = now_ns() + 50000000LL, prev = 0;
    while (now_ns() < end && strcmp(source(), "tsc") == 0) { /* calls back to back across pieces */
        CHECK(ncclAllReduce(0, 0, 1, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "allreduce");
        int64_t x = shim_now();
        CHECK(x >= prev, "monotonic while faulting");
        prev = x;
    }
    int64_t st[8] = {0};
    stats(st, 8);
    CHECK(strcmp(source(), "monotonic") == 0, "still on the counter after %lld faults", (long long)st[5]);
    CHECK(h->clock_source == FAILSLOW_CLOCK_MONOTONIC, "header says clock_gettime now");
    CHECK(st[5] >= 3 && st[6] > 20000, "faults %lld, largest piece error %lld ns", (long long)st[5],
          (long long)st[6]);
    /* times hold still (never step back) until clock_gettime passes the last counter time, then they are
     * clock_gettime's */
    sleep_ms(20);
    for (int i = 0; i < 1000; i++) {
        int64_t a = now_ns(), x = shim_now(), b = now_ns();
        CHECK(a <= x && x <= b, "after the fallback: %lld outside [%lld, %lld]", (long long)x, (long long)a,
              (long long)b);
    }
    printf("clockfault: %lld faults (largest piece error %lld ns) -> clock_gettime\n", (long long)st[5],
           (long long)st[6]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_shim MODE [ARG]\n");
        return 2;
    }
    g_mode = argv[1];
    if (!strcmp(g_mode, "basic")) return mode_basic();
    if (!strcmp(g_mode, "threads")) return mode_threads();
    if (!strcmp(g_mode, "handover")) return mode_handover();
    if (!strcmp(g_mode, "overflow")) return mode_overflow();
    if (!strcmp(g_mode, "fork")) return mode_fork();
    if (!strcmp(g_mode, "killed")) return mode_killed();
    if (!strcmp(g_mode, "suspend")) return mode_suspend();
    if (!strcmp(g_mode, "profile")) return mode_profile();
    if (!strcmp(g_mode, "nodir")) return mode_nodir();
    if (!strcmp(g_mode, "serve")) return mode_serve();
    if (!strcmp(g_mode, "full")) return mode_full();
    if (!strcmp(g_mode, "clock")) return mode_clock();
    if (!strcmp(g_mode, "clockfault")) return mode_clockfault();
    fprintf(stderr, "unknown mode %s\n", g_mode);
    return 2;
}
