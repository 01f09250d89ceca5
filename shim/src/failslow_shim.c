/*
 * libfailslow_shim.so — LD_PRELOAD library that records every NCCL call of an unmodified job into the
 * per-process ring of failslow_ring.h.
 *
 * Rules this file keeps:
 *  - the hot path (a hooked collective) takes no lock, never blocks, never allocates, and makes no syscall
 *    besides the vDSO clock (gettid once per thread, the ring's creation once per process); its own
 *    failures never reach the caller: the real NCCL result is returned unchanged and errno is preserved;
 *  - communicator facts come from NCCL's public API (ncclCommCount/UserRank/CuDevice) and the init/split
 *    arguments, never from NCCL's private structs;
 *  - the real functions are found with dlsym(RTLD_NEXT), falling back to dlopen(FAILSLOW_NCCL_LIB or
 *    libnccl.so.2) — needed when libnccl was loaded RTLD_LOCAL as a dependency of a Python extension;
 *  - a process gets its ring at its first NCCL call (so unrelated programs that inherit LD_PRELOAD leave
 *    nothing behind), a forked child gets its own ring, and the ring is removed at exit unless
 *    FAILSLOW_KEEP_RINGS=1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ------------------------------------------------------------------------------------------------ */
/* hashing (stable communicator ids)                                                                */

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_BASIS 0xcbf29ce484222325ull

/* ------------------------------------------------------------------------------------------------ */
/* process state                                                                                    */

enum { RING_NONE = 0, RING_CREATING = 1, RING_READY = 2, RING_DISABLED = 3 };

static struct failslow_ring_header *g_ring; /* published with release once ready */
static int g_ring_state;
static size_t g_ring_size;
static pid_t g_ring_pid;
static char g_ring_path[PATH_MAX];
static int g_keep_rings;
static int g_debug;
static unsigned g_suspend_default_ms = 10000;

static TLS int t_in_hook;      /* >0 while inside a hooked call: nested NCCL calls are not recorded */
static TLS int t_group_depth;  /* ncclGroupStart nesting */
static TLS uint32_t t_tid;

static void dbg(const char *fmt, const char *arg) {
    if (g_debug) fprintf(stderr, fmt, arg);
}

static uint32_t my_tid(void) {
    if (UNLIKELY(t_tid == 0)) t_tid = (uint32_t)syscall(SYS_gettid);
    return t_tid;
}

/* ------------------------------------------------------------------------------------------------ */
/* clock                                                                                            */
/*
 * Record times are CLOCK_MONOTONIC nanoseconds (readers compare them across processes). On this kind of
 * VM one vDSO clock_gettime costs ~40 ns and the hot path needs two, so where the CPU has an invariant
 * time-stamp counter the shim reads the counter instead (x86-64 rdtsc, aarch64 cntvct_el0) and maps it to
 * CLOCK_MONOTONIC with a fixed-point multiply:  ns = ns0 + ((tsc - tsc0) * mult) >> 32.
 *
 *  - rate (mult, ns per tick << 32): calibrated once per process against clock_gettime over >= 1 ms, then
 *    re-estimated from anchors 100-200 ms apart, so it follows NTP's frequency corrections of
 *    CLOCK_MONOTONIC (the clock we must agree with is the kernel's, not the raw counter);
 *  - offset (tsc0, ns0): per thread, re-anchored from a fresh clock_gettime once the thread's current
 *    piece is older than CLK_PIECE_NS (1 ms) — one extra clock read per thread per millisecond, so the
 *    extrapolation error is at most 1 ms x the rate error plus the anchor's own read error;
 *  - per-thread monotonic: a new piece starts at the true time, and a thread's times hold still (never step
 *    back) until it passes the last time that thread was given;
 *  - a counter that jumps backwards (or forwards past the piece) just forces a re-anchor; re-anchors that
 *    find the mapping off by more than CLK_FAULT_NS three times switch the process to clock_gettime.
 * FAILSLOW_CLOCK=monotonic forces clock_gettime, FAILSLOW_CLOCK=tsc skips the CPU-flag check.
 */

static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* the exact clock for paths that are not per-call hot (suspend deadlines, CUDA anchors) */
static inline int64_t now_ns(void) { return mono_ns(); }

#if defined(__x86_64__)
#include <x86intrin.h>
#define HAVE_TICKS 1
static inline uint64_t ticks(void) { return __rdtsc(); }
#elif defined(__aarch64__)
#define HAVE_TICKS 1
static inline uint64_t ticks(void) {
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
}
#else
#define HAVE_TICKS 0
static inline uint64_t ticks(void) { return 0; }
#endif

enum { CLK_UNSET = 0, CLK_MONO = 1, CLK_TSC = 2 };
#define CLK_PIECE_NS 1000000LL       /* re-anchor a thread's mapping after 1 ms */
#define CLK_CALIB_NS 1000000LL       /* initial rate calibration span */
#define CLK_RATE_WINDOW_NS 100000000LL /* rate anchors move every 100 ms: the rate spans 100-200 ms */
#define CLK_FAULT_NS 20000LL         /* a mapping this far off means the counter is not usable */
#define CLK_MAX_FAULTS 3

static int g_clk_mode;           /* CLK_*; read by every call (relaxed), written at setup or on faults */
static uint64_t g_clk_mult;      /* ns per tick, 32.32 fixed point */
static uint64_t g_clk_piece;     /* CLK_PIECE_NS in ticks (bounded so that piece * mult < 2^63) */
static uint64_t g_clk_tight;     /* ticks: an anchor read this narrow is as good as it gets */
static int g_clk_lock;           /* trylock for the rate anchors (never waited on) */
static uint64_t g_rate_tsc[2];   /* [0] older, [1] newer rate anchor (under g_clk_lock) */
static int64_t g_rate_ns[2];
static pthread_once_t g_clk_once = PTHREAD_ONCE_INIT;
static double g_clk_skew = 1.0;  /* tests only (FAILSLOW_CLOCK_TEST_SKEW_PPM): a wrong rate, to see faults */
/* statistics for the tests and the bench (slow path only) */
static uint64_t g_clk_reanchors, g_clk_faults, g_clk_rate_updates;
static int64_t g_clk_max_err_ns, g_clk_max_bracket_ns;

struct clk_piece {
    uint64_t tsc0;  /* anchor tick */
    int64_t ns0;    /* CLOCK_MONOTONIC at tsc0 */
    uint64_t mult;  /* copy of g_clk_mult when anchored */
    uint64_t limit; /* ticks this piece is valid for; 0 = no piece yet */
    int64_t last;   /* last time returned to this thread */
};
static TLS struct clk_piece t_clk;

/* One anchor: a CLOCK_MONOTONIC read bracketed by two tick reads (best of up to 3 tries: an interrupt
 * between the reads widens the bracket); *tsc is the bracket's midpoint, *width its size. */
static int64_t clk_pair(uint64_t *tsc, uint64_t *width) {
    uint64_t best_w = UINT64_MAX, best_t = 0;
    int64_t best_m = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t a = ticks();
        int64_t m = mono_ns();
        uint64_t b = ticks();
        if (b >= a && b - a < best_w) {
            best_w = b - a;
            best_t = a + (b - a) / 2;
            best_m = m;
        }
        if (best_w <= g_clk_tight) break;
    }
    *tsc = best_t;
    *width = best_w;
    return best_m;
}

static int tsc_invariant(void) {
#if defined(__x86_64__)
    char buf[64] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n >= 3 && strncmp(buf, "tsc", 3) == 0 && (n == 3 || buf[3] == '\n')) return 1;
    }
    /* the kernel chose another clocksource: trust the CPU's own word on an invariant counter */
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (!f) return 0;
    char line[4096];
    int ok = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        ok = strstr(line, " constant_tsc") && strstr(line, " nonstop_tsc");
        break;
    }
    fclose(f);
    return ok;
#elif defined(__aarch64__)
    return 1; /* the architected generic timer runs at a fixed frequency by specification */
#else
    return 0;
#endif
}

static void clk_setup(void) {
    int saved = errno;
    int mode = CLK_MONO;
    const char *env = getenv("FAILSLOW_CLOCK");
    int forced = env && strcmp(env, "tsc") == 0;
    const char *skew = getenv("FAILSLOW_CLOCK_TEST_SKEW_PPM");
    if (skew && *skew) {
        char *end;
        double ppm = strtod(skew, &end);
        if (*end == 0 && ppm > -500000.0 && ppm < 500000.0) g_clk_skew = 1.0 + ppm * 1e-6;
    }
    if (env && *env && strcmp(env, "monotonic") != 0 && strcmp(env, "tsc") != 0 && strcmp(env, "auto") != 0)
        dbg("failslow shim: ignoring FAILSLOW_CLOCK=%s (auto, tsc or monotonic)\n", env);
    if (HAVE_TICKS && !(env && strcmp(env, "monotonic") == 0) && (forced || tsc_invariant())) {
        /* rate over >= 1 ms of busy-waiting, once per process (at its first NCCL call) */
        uint64_t ta, tb, wa, wb;
        g_clk_tight = 0;
        int64_t ma = clk_pair(&ta, &wa);
        while (mono_ns() - ma < CLK_CALIB_NS) {
        }
        int64_t mb = clk_pair(&tb, &wb);
        double rate = (wa != UINT64_MAX && wb != UINT64_MAX && tb > ta) ? (double)(mb - ma) / (double)(tb - ta)
                                                                         : 0.0; /* ns per tick */
        if (rate > 0.01 && rate < 100.0) {
            g_clk_mult = (uint64_t)(rate * g_clk_skew * 4294967296.0 + 0.5);
            uint64_t piece = (uint64_t)((double)CLK_PIECE_NS / rate);
            uint64_t cap = (UINT64_MAX >> 2) / g_clk_mult; /* piece * mult stays far below 2^64 */
            g_clk_piece = piece < cap ? piece : cap;
            g_clk_tight = 2 * (wa < wb ? wa : wb);
            g_rate_tsc[0] = ta;
            g_rate_ns[0] = ma;
            g_rate_tsc[1] = tb;
            g_rate_ns[1] = mb;
            mode = CLK_TSC;
        } else {
            dbg("%s", "failslow shim: implausible tick rate; using clock_gettime\n");
        }
    }
    __atomic_store_n(&g_clk_mode, mode, __ATOMIC_RELEASE);
    errno = saved;
}

static void clk_init(void) { pthread_once(&g_clk_once, clk_setup); }

/* Start a new piece for this thread at the current instant and return that instant's time. */
static __attribute__((noinline, cold)) int64_t clk_reanchor(void) {
    int saved = errno;
    struct clk_piece *c = &t_clk;
    uint64_t tsc, width;
    int64_t m = clk_pair(&tsc, &width);
    if (UNLIKELY(width == UINT64_MAX)) { /* the counter went backwards inside every bracket: no anchor now */
        c->limit = 0;                    /* the next timestamp tries again */
        int64_t now = mono_ns(), r = now > c->last ? now : c->last;
        c->last = r;
        errno = saved;
        return r;
    }
    __atomic_add_fetch(&g_clk_reanchors, 1, __ATOMIC_RELAXED);
    int64_t bracket = (int64_t)(((unsigned __int128)width * g_clk_mult) >> 32);
    if (bracket > __atomic_load_n(&g_clk_max_bracket_ns, __ATOMIC_RELAXED))
        __atomic_store_n(&g_clk_max_bracket_ns, bracket, __ATOMIC_RELAXED);
    uint64_t d = tsc - c->tsc0;
    if (c->limit && d < 2 * c->limit) {
        /* the piece just ended: how far off was its extrapolation? (an idle thread's stale piece is not
         * judged: it returned nothing in between) */
        int64_t pred = c->ns0 + (int64_t)(((unsigned __int128)d * c->mult) >> 32);
        int64_t err = pred > m ? pred - m : m - pred;
        if (err > __atomic_load_n(&g_clk_max_err_ns, __ATOMIC_RELAXED))
            __atomic_store_n(&g_clk_max_err_ns, err, __ATOMIC_RELAXED);
        if (err > CLK_FAULT_NS) {
            if (__atomic_add_fetch(&g_clk_faults, 1, __ATOMIC_RELAXED) >= CLK_MAX_FAULTS) {
                dbg("%s", "failslow shim: the tick counter disagrees with CLOCK_MONOTONIC; using clock_gettime\n");
                __atomic_store_n(&g_clk_mode, CLK_MONO, __ATOMIC_RELAXED);
                struct failslow_ring_header *h = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
                if (h) __atomic_store_n(&h->clock_source, FAILSLOW_CLOCK_MONOTONIC, __ATOMIC_RELAXED);
            }
        }
    }
    if (__atomic_exchange_n(&g_clk_lock, 1, __ATOMIC_ACQUIRE) == 0) {
        /* refine the rate from the older anchor (100-200 ms back): long enough that the anchors' read
         * error hardly matters, short enough to follow NTP's corrections to CLOCK_MONOTONIC */
        uint64_t bt = g_rate_tsc[0];
        int64_t bn = g_rate_ns[0];
        if (tsc > bt && m > bn && tsc - bt >= g_clk_piece) {
            double rate = (double)(m - bn) / (double)(tsc - bt);
            if (rate > 0.01 && rate < 100.0) {
                __atomic_store_n(&g_clk_mult, (uint64_t)(rate * g_clk_skew * 4294967296.0 + 0.5), __ATOMIC_RELAXED);
                __atomic_add_fetch(&g_clk_rate_updates, 1, __ATOMIC_RELAXED);
            }
        }
        if (tsc < g_rate_tsc[1] || m - g_rate_ns[1] >= CLK_RATE_WINDOW_NS) {
            g_rate_tsc[0] = g_rate_tsc[1];
            g_rate_ns[0] = g_rate_ns[1];
            g_rate_tsc[1] = tsc;
            g_rate_ns[1] = m;
        }
        __atomic_store_n(&g_clk_lock, 0, __ATOMIC_RELEASE);
    }
    /* the piece starts at the true time (so no error is carried from piece to piece); what this thread is
     * given never steps back: below its last time it holds still until the new piece passes it */
    int64_t t = m > c->last ? m : c->last;
    c->tsc0 = tsc;
    c->ns0 = m;
    c->mult = __atomic_load_n(&g_clk_mult, __ATOMIC_RELAXED);
    c->limit = g_clk_piece;
    c->last = t;
    errno = saved;
    return t;
}

/* The hot-path clock: CLOCK_MONOTONIC ns, from the tick counter when it is usable. */
static inline int64_t clk_now(void) {
    if (LIKELY(__atomic_load_n(&g_clk_mode, __ATOMIC_RELAXED) == CLK_TSC)) {
        struct clk_piece *c = &t_clk;
        uint64_t d = ticks() - c->tsc0;
        if (LIKELY(d < c->limit)) {
            int64_t t = c->ns0 + (int64_t)((d * c->mult) >> 32);
            if (UNLIKELY(t < c->last)) t = c->last;
            c->last = t;
            return t;
        }
        return clk_reanchor();
    }
    /* clock_gettime; kept monotonic per thread across a fallback from a counter that ran ahead */
    int64_t t = mono_ns();
    if (UNLIKELY(t < t_clk.last)) t = t_clk.last;
    t_clk.last = t;
    return t;
}

/* ------------------------------------------------------------------------------------------------ */
/* finding the real NCCL                                                                            */

static void *g_nccl_handle;

static void *self_base(void) {
    Dl_info info;
    if (dladdr((void *)&self_base, &info) && info.dli_fbase) return info.dli_fbase;
    return NULL;
}

static int is_ours(void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_fbase == self_base();
}

static void *resolve(const char *name) {
    void *p = dlsym(RTLD_NEXT, name);
    if (p && !is_ours(p)) return p;
    void *h = __atomic_load_n(&g_nccl_handle, __ATOMIC_ACQUIRE);
    if (!h) {
        const char *lib = getenv("FAILSLOW_NCCL_LIB");
        h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            dbg("failslow shim: cannot load NCCL: %s\n", dlerror());
            return NULL;
        }
        __atomic_store_n(&g_nccl_handle, h, __ATOMIC_RELEASE);
    }
    p = dlsym(h, name);
    return (p && !is_ours(p)) ? p : NULL;
}

/* Resolve once per symbol; a benign race resolves twice to the same pointer. */
#define REAL(type, name)                                                                   \
    static type real_##name;                                                               \
    type fn_##name = __atomic_load_n(&real_##name, __ATOMIC_RELAXED);                      \
    if (UNLIKELY(!fn_##name)) {                                                            \
        fn_##name = (type)resolve(#name);                                                  \
        __atomic_store_n(&real_##name, fn_##name, __ATOMIC_RELAXED);                       \
    }

typedef ncclResult_t (*count_fn)(const ncclComm_t, int *);
static count_fn p_comm_count, p_comm_user_rank, p_comm_cu_device;

static void resolve_queries(void) {
    if (!p_comm_count) p_comm_count = (count_fn)resolve("ncclCommCount");
    if (!p_comm_user_rank) p_comm_user_rank = (count_fn)resolve("ncclCommUserRank");
    if (!p_comm_cu_device) p_comm_cu_device = (count_fn)resolve("ncclCommCuDevice");
}

/* ------------------------------------------------------------------------------------------------ */
/* communicator table: lock-free lookup, inserts under a mutex (init paths only)                    */

#define COMM_TABLE 4096u
#define COMM_PROBE 64u
#define COMM_TOMBSTONE ((uintptr_t)1)

struct comm_entry {
    uintptr_t key; /* ncclComm_t; 0 empty; 1 destroyed */
    uint64_t id;
    int32_t nranks, rank, device;
    uint32_t splits; /* ncclCommSplit calls on this comm: same order on every member */
};

static struct comm_entry g_comms[COMM_TABLE];
static pthread_mutex_t g_comm_lock = PTHREAD_MUTEX_INITIALIZER;

static inline uint32_t comm_slot(const void *comm) {
    return (uint32_t)(mix64((uint64_t)(uintptr_t)comm) & (COMM_TABLE - 1));
}

static struct comm_entry *comm_lookup(ncclComm_t comm) {
    uint32_t s = comm_slot(comm);
    for (uint32_t i = 0; i < COMM_PROBE; i++) {
        struct comm_entry *e = &g_comms[(s + i) & (COMM_TABLE - 1)];
        uintptr_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k == (uintptr_t)comm) return e;
        if (k == 0) return NULL;
    }
    return NULL;
}

static struct comm_entry *comm_insert(ncclComm_t comm, uint64_t id, int nranks, int rank, int device) {
    if (!comm) return NULL;
    pthread_mutex_lock(&g_comm_lock);
    uint32_t s = comm_slot(comm);
    struct comm_entry *got = NULL;
    for (uint32_t i = 0; i < COMM_PROBE; i++) {
        struct comm_entry *e = &g_comms[(s + i) & (COMM_TABLE - 1)];
        uintptr_t k = __atomic_load_n(&e->key, __ATOMIC_RELAXED);
        if (k == (uintptr_t)comm) { /* re-init of a live pointer: update in place */
            got = e;
            break;
        }
        if (k == 0) {
            got = e;
            break;
        }
    }
    if (got) {
        got->id = id;
        got->nranks = nranks;
        got->rank = rank;
        got->device = device;
        got->splits = 0;
        __atomic_store_n(&got->key, (uintptr_t)comm, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_comm_lock);
    return got;
}

static void comm_remove(ncclComm_t comm) {
    pthread_mutex_lock(&g_comm_lock);
    struct comm_entry *e = comm_lookup(comm);
    /* tombstone, not empty: later entries of the probe chain must stay reachable */
    if (e) __atomic_store_n(&e->key, COMM_TOMBSTONE, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_comm_lock);
}

/* Facts of a communicator for a record; comms we never saw initialised get a per-process id. */
struct comm_facts {
    uint64_t id;
    int32_t nranks, rank, device;
};

static void comm_facts(ncclComm_t comm, struct comm_facts *f) {
    struct comm_entry *e = comm_lookup(comm);
    if (LIKELY(e != NULL)) {
        f->id = e->id;
        f->nranks = e->nranks;
        f->rank = e->rank;
        f->device = e->device;
        if (LIKELY(f->nranks > 0)) return;
    } else {
        f->id = mix64((uint64_t)(uintptr_t)comm ^ ((uint64_t)getpid() << 32));
        f->device = -1;
    }
    /* not known yet (nonblocking init still in progress, or an init path we do not hook) */
    int n = 0, r = -1;
    resolve_queries();
    if (p_comm_count && p_comm_count(comm, &n) == ncclSuccess && p_comm_user_rank &&
        p_comm_user_rank(comm, &r) == ncclSuccess) {
        f->nranks = n;
        f->rank = r;
        if (e) {
            e->rank = r;
            __atomic_store_n(&e->nranks, n, __ATOMIC_RELEASE);
        }
    } else {
        f->nranks = 0;
        f->rank = -1;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* CUDA runtime (optional): event timing when libcudart loads and PROFILE is on                     */

typedef int cudaError_t;
typedef void *cudaEvent_t;
#define cudaSuccess 0
#define cudaErrorNotReady 600
#define cudaEventDefault 0u
#define cudaStreamNonBlocking 1u

struct cuda_api {
    int ok;
    cudaError_t (*eventCreateWithFlags)(cudaEvent_t *, unsigned);
    cudaError_t (*eventRecord)(cudaEvent_t, cudaStream_t);
    cudaError_t (*eventQuery)(cudaEvent_t);
    cudaError_t (*eventSynchronize)(cudaEvent_t);
    cudaError_t (*eventElapsedTime)(float *, cudaEvent_t, cudaEvent_t);
    cudaError_t (*eventDestroy)(cudaEvent_t);
    cudaError_t (*setDevice)(int);
    cudaError_t (*getDevice)(int *);
    cudaError_t (*streamCreateWithFlags)(cudaStream_t *, unsigned);
};
static struct cuda_api g_cuda;

static void load_cuda(void) {
    const char *env = getenv("FAILSLOW_CUDART_LIB");
    const char *names[] = {env, "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
    void *h = NULL;
    /* prefer the runtime the application already loaded, so events and streams share its state */
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        if (names[i] && *names[i]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        if (names[i] && *names[i]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
#define CU(field, sym) *(void **)&g_cuda.field = dlsym(h, sym)
    CU(eventCreateWithFlags, "cudaEventCreateWithFlags");
    CU(eventRecord, "cudaEventRecord");
    CU(eventQuery, "cudaEventQuery");
    CU(eventSynchronize, "cudaEventSynchronize");
    CU(eventElapsedTime, "cudaEventElapsedTime");
    CU(eventDestroy, "cudaEventDestroy");
    CU(setDevice, "cudaSetDevice");
    CU(getDevice, "cudaGetDevice");
    CU(streamCreateWithFlags, "cudaStreamCreateWithFlags");
#undef CU
    g_cuda.ok = g_cuda.eventCreateWithFlags && g_cuda.eventRecord && g_cuda.eventQuery &&
                g_cuda.eventSynchronize && g_cuda.eventElapsedTime && g_cuda.eventDestroy && g_cuda.setDevice &&
                g_cuda.getDevice && g_cuda.streamCreateWithFlags;
}

/*
 * Pending GPU measurements: a fixed pool of slots, each with its two events. A hooked call claims a FREE
 * slot with one CAS (none free: the call is recorded without GPU times), records the events around the
 * real call on the caller's stream, claims its ring record and leaves it BUSY; the resolver thread polls
 * cudaEventQuery (never cudaEventSynchronize on application events), fills the GPU start/end mapped to
 * CLOCK_MONOTONIC through an anchor event, and commits the record.
 */
#define PEND_SLOTS 512u
#define PEND_GIVE_UP_NS 2000000000LL /* below the readers' 30 s pending timeout */
enum { PEND_FREE = 0, PEND_CLAIMED = 1, PEND_READY = 2 };

struct pending {
    int state;
    cudaEvent_t ev0, ev1;
    struct failslow_record *rec;
    uint64_t seq;
    int64_t t_claim;
};

static struct pending g_pend[PEND_SLOTS];
static int g_pool_ready;  /* events created (by the resolver thread) */
static int g_pool_device = -1;
static uint32_t g_pend_next;
static pthread_t g_resolver;
static int g_resolver_running;
static int g_resolver_stop;
static cudaEvent_t g_anchor;
static cudaStream_t g_anchor_stream;
static int64_t g_anchor_ns;

static int64_t gpu_to_mono(cudaEvent_t ev, int *ok) {
    float ms = 0.f;
    if (g_cuda.eventElapsedTime(&ms, g_anchor, ev) != cudaSuccess) {
        *ok = 0;
        return 0;
    }
    return g_anchor_ns + (int64_t)((double)ms * 1e6);
}

static int refresh_anchor(void) {
    if (!g_anchor_stream && g_cuda.streamCreateWithFlags(&g_anchor_stream, cudaStreamNonBlocking) != cudaSuccess)
        return 0;
    if (!g_anchor && g_cuda.eventCreateWithFlags(&g_anchor, cudaEventDefault) != cudaSuccess) return 0;
    if (g_cuda.eventRecord(g_anchor, g_anchor_stream) != cudaSuccess) return 0;
    /* synchronising our own anchor event in our own thread never stalls the application */
    if (g_cuda.eventSynchronize(g_anchor) != cudaSuccess) return 0;
    g_anchor_ns = now_ns();
    return 1;
}

static int create_pool(void) {
    int dev = g_pool_device >= 0 ? g_pool_device : 0;
    if (g_cuda.setDevice(dev) != cudaSuccess) return 0;
    for (unsigned i = 0; i < PEND_SLOTS; i++) {
        if (g_cuda.eventCreateWithFlags(&g_pend[i].ev0, cudaEventDefault) != cudaSuccess ||
            g_cuda.eventCreateWithFlags(&g_pend[i].ev1, cudaEventDefault) != cudaSuccess)
            return 0;
    }
    return refresh_anchor();
}

static void resolve_one(struct pending *p, int64_t now) {
    cudaError_t q = g_cuda.eventQuery(p->ev1);
    if (q == cudaErrorNotReady && now - p->t_claim < PEND_GIVE_UP_NS) return;
    struct failslow_record *r = p->rec;
    int ok = (q == cudaSuccess);
    if (ok) {
        int64_t s = gpu_to_mono(p->ev0, &ok), e = gpu_to_mono(p->ev1, &ok);
        if (ok) {
            r->t_start_ns = s;
            r->t_end_ns = e;
            r->flags |= FAILSLOW_F_GPU_TIMES;
        }
    }
    if (!ok) r->flags |= FAILSLOW_F_GPU_FAILED;
    failslow_ring_commit(r, p->seq);
    __atomic_store_n(&p->state, PEND_FREE, __ATOMIC_RELEASE);
}

static void *resolver_main(void *arg) {
    (void)arg;
    int64_t last_anchor = 0;
    while (!__atomic_load_n(&g_resolver_stop, __ATOMIC_ACQUIRE)) {
        struct failslow_ring_header *h = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
        unsigned ctl = h ? __atomic_load_n(&h->control, __ATOMIC_RELAXED) : 0u;
        if ((ctl & FAILSLOW_CTL_PROFILE) && !__atomic_load_n(&g_pool_ready, __ATOMIC_ACQUIRE)) {
            if (create_pool()) {
                last_anchor = now_ns();
                __atomic_store_n(&g_pool_ready, 1, __ATOMIC_RELEASE);
            } else {
                dbg("%s", "failslow shim: CUDA event pool unavailable; host timing only\n");
                return NULL;
            }
        }
        int busy = 0;
        if (__atomic_load_n(&g_pool_ready, __ATOMIC_ACQUIRE)) {
            int64_t now = now_ns();
            if (now - last_anchor > 1000000000LL) { /* bound float drift of elapsed times */
                refresh_anchor();
                last_anchor = now;
            }
            for (unsigned i = 0; i < PEND_SLOTS; i++) {
                struct pending *p = &g_pend[i];
                if (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) == PEND_READY) {
                    busy = 1;
                    resolve_one(p, now);
                }
            }
        }
        struct timespec ts = {0, busy ? 200000 : 5000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void start_resolver(void) {
    if (!g_cuda.ok || g_resolver_running) return;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&g_resolver, &a, resolver_main, NULL) == 0) g_resolver_running = 1;
    pthread_attr_destroy(&a);
}

/* ------------------------------------------------------------------------------------------------ */
/* ring creation                                                                                    */

static int env_int(const char *const *names, int dflt) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end == 0 && x >= INT32_MIN && x <= INT32_MAX) return (int)x;
        }
    }
    return dflt;
}

static void copy_str(char *dst, size_t n, const char *src) {
    size_t i = 0;
    for (; src && src[i] && i + 1 < n; i++) dst[i] = src[i];
    for (; i < n; i++) dst[i] = 0;
}

static void at_exit_cleanup(void);

static void single_writer_setup(void);

static struct failslow_ring_header *create_ring(void) {
    const char *dir = getenv("FAILSLOW_SHM_DIR");
    if (!dir || !*dir) dir = "/dev/shm";
    unsigned cap = FAILSLOW_RING_DEFAULT_CAPACITY;
    const char *cs = getenv("FAILSLOW_RING_CAPACITY");
    if (cs && *cs) {
        char *end;
        unsigned long c = strtoul(cs, &end, 10);
        if (*end == 0 && c >= FAILSLOW_RING_MIN_CAPACITY && c <= FAILSLOW_RING_MAX_CAPACITY && !(c & (c - 1)))
            cap = (unsigned)c;
        else
            dbg("failslow shim: ignoring FAILSLOW_RING_CAPACITY=%s (power of two in [16, 2^24])\n", cs);
    }
    pid_t pid = getpid();
    char tmp[PATH_MAX];
    if (snprintf(g_ring_path, sizeof g_ring_path, "%s/failslow-%d.ring", dir, (int)pid) >= (int)sizeof g_ring_path ||
        snprintf(tmp, sizeof tmp, "%s/.failslow-%d.ring.tmp", dir, (int)pid) >= (int)sizeof tmp)
        return NULL;
    size_t size = FAILSLOW_RING_HEADER_SIZE + (size_t)cap * FAILSLOW_RECORD_SIZE;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        dbg("failslow shim: cannot create ring in %s\n", dir);
        return NULL;
    }
    /* reserve the pages now: a write into a sparse tmpfs file that cannot get a page is a SIGBUS in the
     * training process (a full /dev/shm, e.g. a container's 64 MiB default); failing here only turns
     * recording off */
    if (ftruncate(fd, (off_t)size) != 0 || posix_fallocate(fd, 0, (off_t)size) != 0) {
        dbg("failslow shim: no room for a ring in %s; recording off\n", dir);
        close(fd);
        unlink(tmp);
        return NULL;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(tmp);
        return NULL;
    }
    struct failslow_ring_header *h = (struct failslow_ring_header *)m;
    memcpy(h->magic, FAILSLOW_RING_MAGIC, 8);
    h->version = FAILSLOW_RING_VERSION;
    h->header_size = FAILSLOW_RING_HEADER_SIZE;
    h->record_size = FAILSLOW_RECORD_SIZE;
    h->capacity = cap;
    h->pid = (int32_t)pid;
    static const char *const rank_env[] = {"RANK", "SLURM_PROCID", NULL};
    static const char *const ws_env[] = {"WORLD_SIZE", "SLURM_NTASKS", NULL};
    static const char *const local_env[] = {"LOCAL_RANK", "SLURM_LOCALID", NULL};
    static const char *const node_env[] = {"FAILSLOW_NODE_ID", "SLURM_NODEID", "GROUP_RANK", NULL};
    static const char *const tp_env[] = {"FAILSLOW_TP", NULL}, *const pp_env[] = {"FAILSLOW_PP", NULL};
    static const char *const dp_env[] = {"FAILSLOW_DP", NULL}, *const cp_env[] = {"FAILSLOW_CP", NULL};
    h->rank = env_int(rank_env, -1);
    h->world_size = env_int(ws_env, 0);
    h->local_rank = env_int(local_env, -1);
    h->node_id = env_int(node_env, -1);
    h->tp = env_int(tp_env, 0);
    h->pp = env_int(pp_env, 0);
    h->dp = env_int(dp_env, 0);
    h->cp = env_int(cp_env, 0);
    h->producer = FAILSLOW_PRODUCER_SHIM;
    struct timespec rt, mt;
    clock_gettime(CLOCK_MONOTONIC, &mt);
    clock_gettime(CLOCK_REALTIME, &rt);
    int64_t mono = (int64_t)mt.tv_sec * 1000000000LL + mt.tv_nsec;
    h->created_mono_ns = mono;
    h->clock_offset_ns = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec - mono;
    const char *job = getenv("FAILSLOW_JOB");
    if (!job || !*job) job = getenv("SLURM_JOB_ID");
    if (!job || !*job) job = getenv("TORCHELASTIC_RUN_ID");
    copy_str(h->job, sizeof h->job, job);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    copy_str(h->hostname, sizeof h->hostname, host);
    clk_init(); /* the tick counter's calibration (~1 ms, once per process) before any record is written */
    single_writer_setup();
    load_cuda();
    h->features = (g_cuda.ok ? FAILSLOW_FEAT_CUDA : 0u);
    h->clock_source = __atomic_load_n(&g_clk_mode, __ATOMIC_RELAXED) == CLK_TSC ? FAILSLOW_CLOCK_TSC
                                                                                : FAILSLOW_CLOCK_MONOTONIC;
    if (rename(tmp, g_ring_path) != 0) {
        munmap(m, size);
        unlink(tmp);
        return NULL;
    }
    g_ring_size = size;
    g_ring_pid = pid;
    start_resolver();
    return h;
}

/* The ring, created at the first NCCL call of this process; NULL while another thread creates it
 * (that call goes unrecorded rather than wait) or when recording is disabled. */
static struct failslow_ring_header *ring(void) {
    struct failslow_ring_header *h = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
    if (LIKELY(h != NULL)) return h;
    if (__atomic_load_n(&g_ring_state, __ATOMIC_RELAXED) != RING_NONE) return NULL; /* no CAS per call */
    int expect = RING_NONE;
    if (!__atomic_compare_exchange_n(&g_ring_state, &expect, RING_CREATING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return NULL;
    int saved = errno;
    h = create_ring();
    errno = saved;
    if (!h) {
        __atomic_store_n(&g_ring_state, RING_DISABLED, __ATOMIC_RELEASE);
        return NULL;
    }
    __atomic_store_n(&g_ring, h, __ATOMIC_RELEASE);
    __atomic_store_n(&g_ring_state, RING_READY, __ATOMIC_RELEASE);
    return h;
}

/* ------------------------------------------------------------------------------------------------ */
/* the hot path                                                                                     */

static inline uint64_t dtype_size(int dt) {
    /* ncclInt8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16, Float8e4m3, e5m2 */
    static const uint8_t size[16] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1, 0, 0, 0, 0};
    return (unsigned)dt < 16u ? size[dt] : 0;
}

struct call {
    struct failslow_ring_header *h;
    int64_t t0;
    uint32_t flags;
    struct pending *pend;
};

static uint32_t suspend_wait(struct failslow_ring_header *h) {
    unsigned ms = __atomic_load_n(&h->suspend_timeout_ms, __ATOMIC_RELAXED);
    if (!ms) ms = g_suspend_default_ms;
    int64_t deadline = now_ns() + (int64_t)ms * 1000000LL;
    uint32_t fl = FAILSLOW_F_SUSPENDED;
    __atomic_add_fetch(&h->suspended, 1, __ATOMIC_RELAXED);
    while (__atomic_load_n(&h->control, __ATOMIC_ACQUIRE) & FAILSLOW_CTL_SUSPEND) {
        if (now_ns() >= deadline) {
            fl |= FAILSLOW_F_SUSPEND_TIMEOUT;
            break;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    __atomic_sub_fetch(&h->suspended, 1, __ATOMIC_RELAXED);
    return fl;
}

/* Before the real call: returns 0 when this call is not recorded (nested, or no ring). */
static inline int call_begin(struct call *c, cudaStream_t stream) {
    if (UNLIKELY(t_in_hook)) return 0;
    struct failslow_ring_header *h = ring();
    if (UNLIKELY(!h)) return 0;
    t_in_hook = 1;
    c->h = h;
    c->flags = FAILSLOW_F_HOST_TIMES;
    c->pend = NULL;
    unsigned ctl = __atomic_load_n(&h->control, __ATOMIC_RELAXED);
    if (UNLIKELY(ctl)) {
        if (ctl & FAILSLOW_CTL_SUSPEND) {
            int saved = errno;
            c->flags |= suspend_wait(h);
            errno = saved;
        }
        if ((ctl & FAILSLOW_CTL_PROFILE) && t_group_depth == 0 && __atomic_load_n(&g_pool_ready, __ATOMIC_ACQUIRE)) {
            uint32_t i = __atomic_fetch_add(&g_pend_next, 1, __ATOMIC_RELAXED) & (PEND_SLOTS - 1);
            int expect = PEND_FREE;
            struct pending *p = &g_pend[i];
            if (__atomic_compare_exchange_n(&p->state, &expect, PEND_CLAIMED, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
                if (g_cuda.eventRecord(p->ev0, stream) == cudaSuccess) {
                    c->pend = p;
                } else {
                    __atomic_store_n(&p->state, PEND_FREE, __ATOMIC_RELEASE);
                    c->flags |= FAILSLOW_F_GPU_FAILED;
                }
            } else {
                c->flags |= FAILSLOW_F_GPU_FAILED; /* pool exhausted: host times only */
            }
        }
    }
    c->t0 = clk_now();
    return 1;
}

/* Facts of a communicator, through a per-thread one-entry cache: a training loop calls on a handful of
 * communicators, mostly the same one back to back, so the hash probe is skipped on most calls. The cached
 * entry is re-validated by its key (destroy tombstones it; a re-init of the same pointer gets a new slot). */
static TLS ncclComm_t t_comm_key;
static TLS struct comm_entry *t_comm_entry;

static inline void comm_facts_fast(ncclComm_t comm, struct comm_facts *f) {
    struct comm_entry *e = t_comm_entry;
    if (LIKELY(comm == t_comm_key && e && __atomic_load_n(&e->key, __ATOMIC_ACQUIRE) == (uintptr_t)comm &&
               __atomic_load_n(&e->nranks, __ATOMIC_ACQUIRE) > 0)) {
        f->id = e->id;
        f->nranks = e->nranks;
        f->rank = e->rank;
        f->device = e->device;
        return;
    }
    int saved = errno; /* the slow path may call into NCCL's query functions */
    comm_facts(comm, f);
    e = comm_lookup(comm);
    t_comm_key = comm;
    t_comm_entry = e;
    errno = saved;
}

/* A 64-bit store of two 32-bit fields (or four narrow ones): fewer stores per record. */
typedef uint64_t __attribute__((may_alias)) u64_alias;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record is little-endian: the packed stores below assume a little-endian CPU"
#endif
#define PACK32(lo, hi) ((uint64_t)(uint32_t)(lo) | ((uint64_t)(uint32_t)(hi) << 32))

/* ------------------------------------------------------------------------------------------------ */
/* claiming a slot: one writer thread without atomics, any number of threads with the ring protocol   */
/*
 * The ring protocol of failslow_ring.h takes two atomic read-modify-writes per record (the fetch-add on
 * write_index and the slot's CAS), ~8-10 ns each on this kind of VM: a fifth of the shim's cost. A training
 * process almost always calls NCCL from one thread, so the first thread that claims a call record OWNS the ring
 * and claims with plain loads and stores (nobody else writes, so nothing can race). The moment any other
 * thread wants to write, the process hands over to the ring protocol for good, and the handover is exact:
 *
 *   owner (every claim):  busy = 1; load contended; if 0: plain claim; busy = 0
 *   newcomer (once):      contended = 1; membarrier(PRIVATE_EXPEDITED); wait until busy == 0; done = 1
 *
 * An asymmetric Dekker handshake: membarrier puts a full barrier into the owner's instruction stream, so
 * either the owner's busy = 1 is visible to the newcomer (who waits for the plain claim to finish) or the
 * owner's load of contended comes after the barrier and sees 1 (and takes the fetch-add). So write_index
 * never goes back and no sequence number is handed out twice — the flaw of a first single-writer path that
 * had no handshake and lost records on a handover. Where membarrier cannot be registered (old kernel,
 * seccomp) or FAILSLOW_SINGLE_WRITER=0, every claim takes the ring protocol. Slot stamps written by the
 * owner are plain stores: a later CAS writer that wraps onto a slot the owner is still filling sees its
 * BUSY stamp (the owner stored it inside its busy window) and drops, as with two CAS writers.
 */
static uint32_t g_owner_tid;     /* the thread that owns the ring; 0 = none (yet, or never) */
static int g_owner_busy;         /* the owner is inside a plain claim (written by the owner only) */
static int g_contended;          /* a second thread writes: every claim takes the ring protocol */
static int g_handover_done;      /* the owner is out of its last plain claim: fetch-adds are safe */
static int g_single_ok;          /* membarrier registered for this process and the fast path allowed */
static pthread_mutex_t g_handover_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_handovers;     /* for the tests: handovers that had to wait for the owner */

/* At ring creation: may this process use the owner's plain claim? */
static void single_writer_setup(void) {
    const char *env = getenv("FAILSLOW_SINGLE_WRITER");
    int ok = !(env && strcmp(env, "0") == 0);
    if (ok) {
        long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
        ok = q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
             syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
        if (!ok) dbg("%s", "failslow shim: membarrier unavailable; every record claims with atomics\n");
    }
    __atomic_store_n(&g_single_ok, ok, __ATOMIC_RELEASE);
}

/* The owner's claim: the ring protocol without its atomics (only this thread writes). */
static inline struct failslow_record *claim_owner(struct failslow_ring_header *h, uint64_t *seq) {
    uint64_t s = __atomic_load_n(&h->write_index, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&h->write_index, s, __ATOMIC_RELAXED);
    struct failslow_record *r = failslow_ring_records(h) + ((s - 1) & (uint64_t)(h->capacity - 1));
    uint64_t old = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    if (UNLIKELY((old & FAILSLOW_STAMP_BUSY) || old >= s)) { /* still pending its GPU times */
        __atomic_add_fetch(&h->dropped, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    __atomic_store_n(&r->seq, s | FAILSLOW_STAMP_BUSY, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the BUSY stamp before any payload store */
    if (old != 0 && s > h->capacity) __atomic_store_n(&h->overwritten, s - h->capacity, __ATOMIC_RELAXED);
    *seq = s;
    return r;
}

/* Slow path of claim() until the handover is done. The first thread that claims a CALL record becomes the
 * owner (control events — init, split, destroy — may come from a helper thread; they are claimed with the
 * ring protocol under the handover lock while there is no owner, so they cannot race the owner's first plain
 * claim). Any claim by another thread once there is an owner ends the plain claims for good, waiting (at
 * most once per process) until the owner is out of the one it may be in. */
static __attribute__((noinline, cold)) struct failslow_record *claim_slow(struct failslow_ring_header *h,
                                                                          uint64_t *seq, int is_call) {
    int saved = errno;
    uint32_t me = my_tid();
    struct failslow_record *r = NULL;
    int done = 0;
    pthread_mutex_lock(&g_handover_lock);
    if (!__atomic_load_n(&g_handover_done, __ATOMIC_ACQUIRE)) {
        uint32_t own = __atomic_load_n(&g_owner_tid, __ATOMIC_RELAXED);
        if (own == 0 && __atomic_load_n(&g_single_ok, __ATOMIC_ACQUIRE) &&
            !__atomic_load_n(&g_contended, __ATOMIC_RELAXED)) {
            if (is_call) __atomic_store_n(&g_owner_tid, me, __ATOMIC_RELEASE); /* its next claims are plain */
            r = failslow_ring_claim(h, seq);                                    /* under the lock: no race */
            done = 1;
        } else if (own != me || __atomic_load_n(&g_contended, __ATOMIC_RELAXED)) {
            __atomic_store_n(&g_contended, 1, __ATOMIC_SEQ_CST);
            if (own != 0 && own != me) {
                if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
                    /* registered at ring creation, so this cannot fail; if it did, a plain claim might
                     * still be in flight unseen: the safest left is to give the owner time to finish it */
                    for (int i = 0; i < 1000; i++) sched_yield();
                }
                int waited = 0;
                while (__atomic_load_n(&g_owner_busy, __ATOMIC_ACQUIRE)) {
                    waited = 1;
                    sched_yield();
                }
                if (waited) __atomic_add_fetch(&g_handovers, 1, __ATOMIC_RELAXED);
            }
            __atomic_store_n(&g_handover_done, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_handover_lock);
    errno = saved;
    return done ? r : failslow_ring_claim(h, seq);
}

static inline __attribute__((always_inline)) struct failslow_record *claim(struct failslow_ring_header *h,
                                                                          uint64_t *seq, int is_call) {
    if (LIKELY(__atomic_load_n(&g_owner_tid, __ATOMIC_RELAXED) == my_tid())) {
        __atomic_store_n(&g_owner_busy, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the compiler keeps the store before the load; the CPU
                                                    is kept in order by the newcomer's membarrier */
        if (LIKELY(!__atomic_load_n(&g_contended, __ATOMIC_RELAXED))) {
            struct failslow_record *r = claim_owner(h, seq);
            __atomic_store_n(&g_owner_busy, 0, __ATOMIC_RELEASE);
            return r;
        }
        __atomic_store_n(&g_owner_busy, 0, __ATOMIC_RELEASE);
    }
    if (UNLIKELY(!__atomic_load_n(&g_handover_done, __ATOMIC_ACQUIRE))) return claim_slow(h, seq, is_call);
    return failslow_ring_claim(h, seq);
}

/* After the real call: write the record. Nothing here can fail or set errno on the common path. */
static inline void call_end(struct call *c, int op, ncclComm_t comm, uint64_t count, int dt, int peer,
                            cudaStream_t stream, ncclResult_t rc, uint64_t aux) {
    struct failslow_ring_header *h = c->h;
    uint32_t flags = c->flags;
    if (UNLIKELY(rc != ncclSuccess && rc != ncclInProgress)) flags |= FAILSLOW_F_ERROR;
    int gd = t_group_depth;
    if (gd > 0) flags |= FAILSLOW_F_IN_GROUP;
    struct pending *p = c->pend;
    int64_t t1 = 0;
    if (UNLIKELY(p != NULL)) {
        int saved = errno;
        t1 = clk_now(); /* before the CUDA call, which can take microseconds */
        if (rc != ncclSuccess || g_cuda.eventRecord(p->ev1, stream) != cudaSuccess) {
            __atomic_store_n(&p->state, PEND_FREE, __ATOMIC_RELEASE);
            p = NULL;
            flags |= FAILSLOW_F_GPU_FAILED;
        }
        errno = saved;
    }
    struct comm_facts f;
    comm_facts_fast(comm, &f);
    uint64_t seq;
    struct failslow_record *r = claim(h, &seq, 1);
    /* the return time is read after the claim (when no CUDA event was recorded): the counter read (~23 ns
     * on a VM) then overlaps the claim's loads instead of holding them up; t_return is later than the real
     * return by the claim (a few ns) */
    if (LIKELY(c->pend == NULL)) t1 = clk_now();
    if (LIKELY(r != NULL)) {
        u64_alias *w = (u64_alias *)(void *)r;
        uint8_t dtb = (dt >= 0 && dt < 255) ? (uint8_t)dt : (uint8_t)FAILSLOW_DTYPE_UNKNOWN;
        uint8_t gdb = (uint8_t)(gd > 255 ? 255 : gd);
        w[1] = f.id;                                     /* comm */
        w[2] = count;                                    /* count */
        w[3] = count * dtype_size(dt);                   /* bytes */
        w[4] = (uint64_t)c->t0;                          /* t_enqueue_ns */
        w[5] = 0;                                        /* t_start_ns */
        w[6] = 0;                                        /* t_end_ns */
        w[7] = (uint64_t)t1;                             /* t_return_ns */
        w[8] = PACK32(f.nranks, f.rank);                 /* nranks, comm_rank */
        w[9] = PACK32(peer, (uint32_t)(uint16_t)op | (uint32_t)dtb << 16 | (uint32_t)gdb << 24);
        w[10] = PACK32(flags, my_tid());                 /* flags, tid */
        w[11] = (uint64_t)(uintptr_t)stream;             /* stream */
        w[12] = aux;                                     /* aux */
        w[13] = PACK32(f.device, 0);                     /* device, reserved0 */
        w[14] = 0;                                       /* reserved1 */
        w[15] = 0;                                       /* reserved2 */
        if (UNLIKELY(p != NULL)) { /* stays BUSY until the resolver fills the GPU times */
            p->rec = r;
            p->seq = seq;
            p->t_claim = t1;
            __atomic_store_n(&p->state, PEND_READY, __ATOMIC_RELEASE);
        } else {
            failslow_ring_commit(r, seq);
        }
        /* the next record's slot, for the next call: its stamp check then hits the cache */
        __builtin_prefetch(failslow_ring_records(h) + (seq & (uint64_t)(h->capacity - 1)), 1, 3);
    } else if (p) {
        __atomic_store_n(&p->state, PEND_FREE, __ATOMIC_RELEASE);
    }
    t_in_hook = 0;
}

/* Control events (init/split/destroy): host time only, committed at once. */
static void record_event(int op, uint64_t id, int nranks, int rank, int device, int peer, uint64_t count,
                         uint64_t aux) {
    struct failslow_ring_header *h = ring();
    if (!h) return;
    int64_t t = clk_now();
    uint64_t seq;
    struct failslow_record *r = claim(h, &seq, 0);
    if (!r) return;
    memset((char *)r + 8, 0, sizeof *r - 8);
    r->comm = id;
    r->count = count;
    r->t_enqueue_ns = t;
    r->t_return_ns = t;
    r->nranks = nranks;
    r->comm_rank = rank;
    r->peer = peer;
    r->op = (uint16_t)op;
    r->dtype = (uint8_t)FAILSLOW_DTYPE_UNKNOWN;
    r->group_depth = (uint8_t)(t_group_depth > 255 ? 255 : t_group_depth);
    r->tid = my_tid();
    r->aux = aux;
    r->device = device;
    failslow_ring_commit(r, seq);
}

static int query_device(ncclComm_t comm) {
    int d = -1;
    resolve_queries();
    if (p_comm_cu_device && p_comm_cu_device(comm, &d) != ncclSuccess) d = -1;
    if (d >= 0 && g_pool_device < 0) g_pool_device = d;
    return d;
}

/* ------------------------------------------------------------------------------------------------ */
/* hooks: collectives and p2p                                                                       */

#define MISSING ncclInvalidUsage /* the application called a function its NCCL does not have */

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclAllReduce)
    if (UNLIKELY(!fn_ncclAllReduce)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
    ncclResult_t rc = fn_ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
    call_end(&c, FAILSLOW_OP_ALLREDUCE, comm, count, datatype, -1, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclAllGather)
    if (UNLIKELY(!fn_ncclAllGather)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
    ncclResult_t rc = fn_ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
    call_end(&c, FAILSLOW_OP_ALLGATHER, comm, sendcount, datatype, -1, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclReduceScatter)
    if (UNLIKELY(!fn_ncclReduceScatter)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream))
        return fn_ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
    ncclResult_t rc = fn_ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
    call_end(&c, FAILSLOW_OP_REDUCESCATTER, comm, recvcount, datatype, -1, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclBroadcast)
    if (UNLIKELY(!fn_ncclBroadcast)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
    ncclResult_t rc = fn_ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
    call_end(&c, FAILSLOW_OP_BROADCAST, comm, count, datatype, root, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclBcast)
    if (UNLIKELY(!fn_ncclBcast)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclBcast(buff, count, datatype, root, comm, stream);
    ncclResult_t rc = fn_ncclBcast(buff, count, datatype, root, comm, stream);
    call_end(&c, FAILSLOW_OP_BROADCAST, comm, count, datatype, root, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                                 cudaStream_t);
    REAL(fn_t, ncclReduce)
    if (UNLIKELY(!fn_ncclReduce)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
    ncclResult_t rc = fn_ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
    call_end(&c, FAILSLOW_OP_REDUCE, comm, count, datatype, root, stream, rc, 0);
    return rc;
}

/* NCCL >= 2.28 spells it ncclAlltoAll; RCCL ncclAllToAll. Both are hooked; each forwards to its own. */
EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclAlltoAll)
    if (UNLIKELY(!fn_ncclAlltoAll)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
    ncclResult_t rc = fn_ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
    call_end(&c, FAILSLOW_OP_ALLTOALL, comm, count, datatype, -1, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclAllToAll)
    if (UNLIKELY(!fn_ncclAllToAll)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclAllToAll(sendbuff, recvbuff, count, datatype, comm, stream);
    ncclResult_t rc = fn_ncclAllToAll(sendbuff, recvbuff, count, datatype, comm, stream);
    call_end(&c, FAILSLOW_OP_ALLTOALL, comm, count, datatype, -1, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclSend)
    if (UNLIKELY(!fn_ncclSend)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclSend(sendbuff, count, datatype, peer, comm, stream);
    ncclResult_t rc = fn_ncclSend(sendbuff, count, datatype, peer, comm, stream);
    call_end(&c, FAILSLOW_OP_SEND, comm, count, datatype, peer, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    typedef ncclResult_t (*fn_t)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    REAL(fn_t, ncclRecv)
    if (UNLIKELY(!fn_ncclRecv)) return MISSING;
    struct call c;
    if (!call_begin(&c, stream)) return fn_ncclRecv(recvbuff, count, datatype, peer, comm, stream);
    ncclResult_t rc = fn_ncclRecv(recvbuff, count, datatype, peer, comm, stream);
    call_end(&c, FAILSLOW_OP_RECV, comm, count, datatype, peer, stream, rc, 0);
    return rc;
}

EXPORT ncclResult_t ncclGroupStart(void) {
    typedef ncclResult_t (*fn_t)(void);
    REAL(fn_t, ncclGroupStart)
    if (UNLIKELY(!fn_ncclGroupStart)) return MISSING;
    ncclResult_t rc = fn_ncclGroupStart();
    if (rc == ncclSuccess) t_group_depth++;
    return rc;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
    typedef ncclResult_t (*fn_t)(void);
    REAL(fn_t, ncclGroupEnd)
    if (UNLIKELY(!fn_ncclGroupEnd)) return MISSING;
    if (t_group_depth > 0) t_group_depth--; /* NCCL leaves the group even when GroupEnd fails */
    return fn_ncclGroupEnd();
}

/* ------------------------------------------------------------------------------------------------ */
/* hooks: communicator lifecycle                                                                    */

static uint64_t id_from_unique(const ncclUniqueId *uid) {
    return mix64(fnv1a(uid->internal, sizeof uid->internal, FNV_BASIS));
}

static void after_init(ncclComm_t comm, uint64_t id, int nranks, int rank) {
    int saved = errno;
    int dev = query_device(comm);
    comm_insert(comm, id, nranks, rank, dev);
    record_event(FAILSLOW_OP_COMM_INIT, id, nranks, rank, dev, -1, 0, 0);
    errno = saved;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    typedef ncclResult_t (*fn_t)(ncclComm_t *, int, ncclUniqueId, int);
    REAL(fn_t, ncclCommInitRank)
    if (UNLIKELY(!fn_ncclCommInitRank)) return MISSING;
    int outer = !t_in_hook;
    t_in_hook++;
    ncclResult_t rc = fn_ncclCommInitRank(comm, nranks, commId, rank);
    t_in_hook--;
    if (outer && (rc == ncclSuccess || rc == ncclInProgress) && comm && *comm)
        after_init(*comm, id_from_unique(&commId), nranks, rank);
    return rc;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
    typedef ncclResult_t (*fn_t)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    REAL(fn_t, ncclCommInitRankConfig)
    if (UNLIKELY(!fn_ncclCommInitRankConfig)) return MISSING;
    int outer = !t_in_hook;
    t_in_hook++;
    ncclResult_t rc = fn_ncclCommInitRankConfig(comm, nranks, commId, rank, config);
    t_in_hook--;
    if (outer && (rc == ncclSuccess || rc == ncclInProgress) && comm && *comm)
        after_init(*comm, id_from_unique(&commId), nranks, rank);
    return rc;
}

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config) {
    typedef ncclResult_t (*fn_t)(ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *);
    REAL(fn_t, ncclCommInitRankScalable)
    if (UNLIKELY(!fn_ncclCommInitRankScalable)) return MISSING;
    int outer = !t_in_hook;
    t_in_hook++;
    ncclResult_t rc = fn_ncclCommInitRankScalable(comm, nranks, rank, nId, commIds, config);
    t_in_hook--;
    if (outer && (rc == ncclSuccess || rc == ncclInProgress) && comm && *comm && nId > 0 && commIds)
        after_init(*comm, mix64(fnv1a(commIds, (size_t)nId * sizeof *commIds, FNV_BASIS)), nranks, rank);
    return rc;
}

static uint32_t g_initall_calls;

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    typedef ncclResult_t (*fn_t)(ncclComm_t *, int, const int *);
    REAL(fn_t, ncclCommInitAll)
    if (UNLIKELY(!fn_ncclCommInitAll)) return MISSING;
    int outer = !t_in_hook;
    t_in_hook++;
    ncclResult_t rc = fn_ncclCommInitAll(comms, ndev, devlist);
    t_in_hook--;
    if (outer && rc == ncclSuccess && comms) {
        /* one process owns every rank: NCCL's unique id stays inside it, so use pid + call number */
        uint32_t n = __atomic_fetch_add(&g_initall_calls, 1, __ATOMIC_RELAXED);
        uint64_t id = mix64(0x696e6974616c6cull ^ ((uint64_t)getpid() << 20) ^ n);
        for (int i = 0; i < ndev; i++)
            if (comms[i]) after_init(comms[i], id, ndev, i);
    }
    return rc;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    typedef ncclResult_t (*fn_t)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
    REAL(fn_t, ncclCommSplit)
    if (UNLIKELY(!fn_ncclCommSplit)) return MISSING;
    int outer = !t_in_hook;
    t_in_hook++;
    ncclResult_t rc = fn_ncclCommSplit(comm, color, key, newcomm, config);
    t_in_hook--;
    if (!outer || (rc != ncclSuccess && rc != ncclInProgress)) return rc;
    int saved = errno;
    /* every member of the parent calls split in the same order with the same colour for one new comm;
     * the key differs per rank, so the id is parent id + colour + the parent's split count */
    struct comm_entry *pe = comm_lookup(comm);
    uint64_t parent = pe ? pe->id : mix64((uint64_t)(uintptr_t)comm);
    uint32_t n = pe ? __atomic_fetch_add(&pe->splits, 1, __ATOMIC_RELAXED) : 0;
    uint64_t id = mix64(parent ^ mix64(((uint64_t)(uint32_t)color << 32) | n));
    int nr = 0, r = -1, dev = -1;
    if (newcomm && *newcomm) {
        resolve_queries();
        if (!p_comm_count || p_comm_count(*newcomm, &nr) != ncclSuccess) nr = 0; /* filled lazily */
        if (!p_comm_user_rank || p_comm_user_rank(*newcomm, &r) != ncclSuccess) r = -1;
        dev = query_device(*newcomm);
        comm_insert(*newcomm, id, nr, r, dev);
    }
    record_event(FAILSLOW_OP_COMM_SPLIT, newcomm && *newcomm ? id : 0, nr, r, dev, color, (uint64_t)(int64_t)key,
                 parent);
    errno = saved;
    return rc;
}

static ncclResult_t end_comm(int op, ncclComm_t comm, ncclResult_t (*fn)(ncclComm_t)) {
    int outer = !t_in_hook;
    if (outer && comm) {
        int saved = errno;
        struct comm_facts f;
        struct comm_entry *e = comm_lookup(comm);
        if (e) {
            f.id = e->id;
            f.nranks = e->nranks;
            f.rank = e->rank;
            f.device = e->device;
            record_event(op, f.id, f.nranks, f.rank, f.device, -1, 0, 0);
        }
        comm_remove(comm); /* before the pointer can be reused by a new init */
        errno = saved;
    }
    t_in_hook++;
    ncclResult_t rc = fn(comm);
    t_in_hook--;
    return rc;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    typedef ncclResult_t (*fn_t)(ncclComm_t);
    REAL(fn_t, ncclCommDestroy)
    if (UNLIKELY(!fn_ncclCommDestroy)) return MISSING;
    return end_comm(FAILSLOW_OP_COMM_DESTROY, comm, fn_ncclCommDestroy);
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    typedef ncclResult_t (*fn_t)(ncclComm_t);
    REAL(fn_t, ncclCommAbort)
    if (UNLIKELY(!fn_ncclCommAbort)) return MISSING;
    return end_comm(FAILSLOW_OP_COMM_ABORT, comm, fn_ncclCommAbort);
}

/* ------------------------------------------------------------------------------------------------ */
/* process lifecycle                                                                                */

static void after_fork_child(void) {
    /* the parent's ring stays the parent's: the child gets its own at its next NCCL call */
    struct failslow_ring_header *h = g_ring;
    if (h) munmap(h, g_ring_size);
    g_ring = NULL;
    g_ring_state = RING_NONE;
    g_ring_pid = 0;
    t_tid = 0;
    t_in_hook = 0;
    /* threads do not survive fork: no resolver, and no CUDA use in the child without a new pool */
    g_resolver_running = 0;
    g_clk_lock = 0; /* a thread that held it is gone; the calibration itself is inherited (same counter) */
    /* one thread, a new ring: whoever claims first owns it (membarrier is registered again with the ring) */
    g_owner_tid = 0;
    g_owner_busy = 0;
    g_contended = 0;
    g_handover_done = 0;
    g_single_ok = 0;
    pthread_mutex_init(&g_handover_lock, NULL);
    t_comm_key = NULL;
    t_comm_entry = NULL;
    g_pool_ready = 0;
    for (unsigned i = 0; i < PEND_SLOTS; i++) g_pend[i].state = PEND_FREE;
}

static void at_exit_cleanup(void) {
    __atomic_store_n(&g_resolver_stop, 1, __ATOMIC_RELEASE);
    struct failslow_ring_header *h = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
    if (h && g_ring_pid == getpid() && !g_keep_rings) unlink(g_ring_path);
}

__attribute__((constructor)) static void shim_init(void) {
    const char *k = getenv("FAILSLOW_KEEP_RINGS");
    g_keep_rings = k && *k && strcmp(k, "0") != 0;
    const char *d = getenv("FAILSLOW_SHIM_DEBUG");
    g_debug = d && *d && strcmp(d, "0") != 0;
    const char *st = getenv("FAILSLOW_SUSPEND_TIMEOUT_MS");
    if (st && *st) {
        char *end;
        unsigned long v = strtoul(st, &end, 10);
        if (*end == 0 && v > 0 && v < 3600000ul) g_suspend_default_ms = (unsigned)v;
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    atexit(at_exit_cleanup);
}

/* For tests and tools: the path of this process's ring ("" before the first NCCL call). */
EXPORT const char *failslow_shim_ring_path(void) {
    return __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE) ? g_ring_path : "";
}

/* For tests and tools: the shim's record clock (CLOCK_MONOTONIC ns) and its source, "tsc" or "monotonic". */
EXPORT int64_t failslow_shim_now_ns(void) {
    clk_init();
    return clk_now();
}

EXPORT const char *failslow_shim_clock_source(void) {
    clk_init();
    return __atomic_load_n(&g_clk_mode, __ATOMIC_RELAXED) == CLK_TSC ? "tsc" : "monotonic";
}

/* For tests and tools: out[0..7] = mode (1 monotonic, 2 tsc), mult (ns per tick << 32), piece length in
 * ticks, re-anchors, rate updates, faults, largest |error| of an ending piece (ns), widest anchor read (ns). */
/* For tests: the claim state, {owner tid, single-writer allowed, contended, handover done, handovers that
 * found the owner inside a plain claim and waited for it}. Returns how many values were written. */
EXPORT int failslow_shim_claim_stats(int64_t *out, int n) {
    int64_t v[5] = {__atomic_load_n(&g_owner_tid, __ATOMIC_ACQUIRE), __atomic_load_n(&g_single_ok, __ATOMIC_ACQUIRE),
                    __atomic_load_n(&g_contended, __ATOMIC_ACQUIRE), __atomic_load_n(&g_handover_done, __ATOMIC_ACQUIRE),
                    (int64_t)__atomic_load_n(&g_handovers, __ATOMIC_RELAXED)};
    int k = n < 5 ? n : 5;
    for (int i = 0; i < k; i++) out[i] = v[i];
    return k;
}

EXPORT int failslow_shim_clock_stats(int64_t *out, int n) {
    clk_init();
    int64_t v[8] = {__atomic_load_n(&g_clk_mode, __ATOMIC_RELAXED), (int64_t)g_clk_mult, (int64_t)g_clk_piece,
                    (int64_t)__atomic_load_n(&g_clk_reanchors, __ATOMIC_RELAXED),
                    (int64_t)__atomic_load_n(&g_clk_rate_updates, __ATOMIC_RELAXED),
                    (int64_t)__atomic_load_n(&g_clk_faults, __ATOMIC_RELAXED),
                    __atomic_load_n(&g_clk_max_err_ns, __ATOMIC_RELAXED),
                    __atomic_load_n(&g_clk_max_bracket_ns, __ATOMIC_RELAXED)};
    int k = n < 8 ? n : 8;
    for (int i = 0; i < k; i++) out[i] = v[i];
    return k;
}
