/*
 * A stand-in libcudart for the shim's GPU-timing path (there is no GPU here). It models only the event
 * semantics the shim relies on: an event recorded at host time t completes at t + FAKE_CUDA_LAG_NS
 * (the GPU running behind the host); cudaEventQuery says cudaErrorNotReady (600) until then;
 * cudaEventElapsedTime is the difference of completion times in ms (float, as CUDA's). It tests the
 * shim's pool / asynchronous resolution / clock mapping logic, not CUDA itself.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define API __attribute__((visibility("default")))

struct ev {
    int64_t t_done;
    int recorded;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t lag(void) {
    const char *l = getenv("FAKE_CUDA_LAG_NS");
    return l ? atol(l) : 1000000;
}

static long g_records;

API int cudaEventCreateWithFlags(void **e, unsigned flags) {
    (void)flags;
    struct ev *x = calloc(1, sizeof *x);
    if (!x) return 2;
    *e = x;
    return 0;
}
API int cudaEventRecord(void *e, void *stream) {
    (void)stream;
    struct ev *x = e;
    x->t_done = now_ns() + lag();
    __atomic_store_n(&x->recorded, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&g_records, 1, __ATOMIC_RELAXED);
    return 0;
}
API int cudaEventQuery(void *e) {
    struct ev *x = e;
    if (!__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE)) return 0;
    return now_ns() >= x->t_done ? 0 : 600;
}
API int cudaEventSynchronize(void *e) {
    struct ev *x = e;
    while (now_ns() < x->t_done) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 0;
}
API int cudaEventElapsedTime(float *ms, void *a, void *b) {
    struct ev *x = a, *y = b;
    int64_t now = now_ns();
    if (now < x->t_done || now < y->t_done) return 600;
    *ms = (float)((double)(y->t_done - x->t_done) / 1e6);
    return 0;
}
API int cudaEventDestroy(void *e) {
    free(e);
    return 0;
}
API int cudaSetDevice(int d) {
    (void)d;
    return 0;
}
API int cudaGetDevice(int *d) {
    *d = 0;
    return 0;
}
API int cudaStreamCreateWithFlags(void **s, unsigned f) {
    (void)f;
    *s = (void *)0x5157;
    return 0;
}
API long fake_cuda_records(void) { return __atomic_load_n(&g_records, __ATOMIC_RELAXED); }
