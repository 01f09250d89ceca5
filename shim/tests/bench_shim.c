/*
 * Host-path cost of an NCCL call against the stand-in libnccl (which returns at once): run it bare and
 * under LD_PRELOAD=libfailslow_shim.so; the difference is what the shim adds per call.
 * Usage: bench_shim CALLS THREADS -> "ns_per_call W cpu_ns_per_call C" (means over threads; W from the wall
 *                                    clock, C from the thread's CPU clock, which excludes time spent descheduled),
 *                                    then, when the shim is preloaded, "source S reanchors R max_err_ns E" (its
 *                                    record clock, re-anchors of the TSC mapping, largest error of an ending piece)
 *        bench_shim clock N        -> "ns_per_clock W cpu_ns_per_clock C" (one clock_gettime(CLOCK_MONOTONIC))
 *        bench_shim tsc N          -> same for one rdtsc (x86-64 only)
 *        bench_shim shimclock N    -> same for one read of the shim's record clock (needs LD_PRELOAD), plus
 *                                    "source S"
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dlfcn.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "nccl_abi.h"

static long g_calls;
static ncclComm_t g_comm[64];
static double g_ns[64], g_cpu_ns[64];
static pthread_barrier_t g_bar;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *run(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < 1000; i++) ncclAllReduce(0, 0, 1024, ncclFloat32, ncclSum, g_comm[t], 0); /* warm */
    pthread_barrier_wait(&g_bar);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    int64_t t0 = now_ns();
    for (long i = 0; i < g_calls; i++) ncclAllReduce(0, 0, 1024, ncclFloat32, ncclSum, g_comm[t], 0);
    g_ns[t] = (double)(now_ns() - t0) / (double)g_calls;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    /* CPU time of this thread: robust to being descheduled on a shared machine */
    g_cpu_ns[t] = ((double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec)) / (double)g_calls;
    return NULL;
}

static volatile int64_t g_sink;

static void time_reads(const char *what, long n) {
    int64_t (*shim_now)(void) = NULL;
    const char *(*source)(void) = NULL;
    if (!strcmp(what, "shimclock")) {
        shim_now = (int64_t (*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_now_ns");
        source = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_clock_source");
        if (!shim_now || !source) {
            fprintf(stderr, "bench_shim shimclock: libfailslow_shim.so is not preloaded\n");
            exit(2);
        }
        shim_now(); /* calibration happens at the first read */
    }
    struct timespec ts, c0, c1;
    int64_t acc = 0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    int64_t t0 = now_ns();
    if (shim_now) {
        for (long i = 0; i < n; i++) acc += shim_now();
    } else if (!strcmp(what, "tsc")) {
#if defined(__x86_64__)
        for (long i = 0; i < n; i++) acc += (int64_t)__rdtsc();
#else
        fprintf(stderr, "bench_shim tsc: x86-64 only\n");
        exit(2);
#endif
    } else {
        for (long i = 0; i < n; i++) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            acc += ts.tv_nsec;
        }
    }
    double wall = (double)(now_ns() - t0) / (double)n;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    g_sink = acc;
    double cpu = ((double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec)) / (double)n;
    printf("ns_per_clock %.2f cpu_ns_per_clock %.2f", wall, cpu);
    if (source) printf(" source %s", source());
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc == 3 && (!strcmp(argv[1], "clock") || !strcmp(argv[1], "tsc") || !strcmp(argv[1], "shimclock"))) {
        time_reads(argv[1], atol(argv[2])); /* the cost of one timestamp, the shim's main expense */
        return 0;
    }
    if (argc != 3) return 2;
    g_calls = atol(argv[1]);
    int nt = atoi(argv[2]);
    if (nt < 1 || nt > 64 || g_calls < 1) return 2;
    for (int t = 0; t < nt; t++) {
        ncclUniqueId id;
        memset(id.internal, t + 1, sizeof id.internal);
        if (ncclCommInitRank(&g_comm[t], nt, id, t) != ncclSuccess) return 1;
    }
    pthread_barrier_init(&g_bar, NULL, (unsigned)nt);
    pthread_t th[64];
    for (long t = 0; t < nt; t++) pthread_create(&th[t], NULL, run, (void *)t);
    double sum = 0, cpu = 0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        sum += g_ns[t];
        cpu += g_cpu_ns[t];
    }
    printf("ns_per_call %.2f cpu_ns_per_call %.2f", sum / nt, cpu / nt);
    const char *(*source)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_clock_source");
    int (*stats)(int64_t *, int) = (int (*)(int64_t *, int))dlsym(RTLD_DEFAULT, "failslow_shim_clock_stats");
    int64_t st[8] = {0};
    if (source && stats && stats(st, 8) == 8)
        printf(" source %s reanchors %lld max_err_ns %lld", source(), (long long)st[3], (long long)st[6]);
    printf("\n");
    return 0;
}
