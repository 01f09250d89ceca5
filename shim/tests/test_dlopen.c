/*
 * The torch situation: the application is not linked with libnccl; a "framework extension" (libapp.so)
 * that is, gets dlopen()ed RTLD_LOCAL, so libnccl lands in a local scope that dlsym(RTLD_NEXT) from the
 * preloaded shim cannot see. The shim must fall back to dlopen("libnccl.so.2") and record the calls.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "failslow_ring.h"
#include "nccl_abi.h"

#define CHECK(c, msg)                                                  \
    do {                                                               \
        if (!(c)) {                                                    \
            fprintf(stderr, "FAIL [dlopen] line %d: %s\n", __LINE__, msg); \
            return 1;                                                  \
        }                                                              \
    } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: test_dlopen LIBAPP");
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, dlerror());
    CHECK(dlsym(RTLD_DEFAULT, "fake_nccl_calls") == NULL, "libnccl must not be in the global scope here");
    int (*app)(ncclComm_t *, int) = (int (*)(ncclComm_t *, int))dlsym(h, "app_allreduce");
    CHECK(app != NULL, "app_allreduce");
    ncclComm_t c;
    CHECK(app(&c, 4) == 0, "calls through the shim reach the real library");
    const char *(*path)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "failslow_shim_ring_path");
    CHECK(path && *path(), "shim preloaded and ring created");
    int fd = open(path(), O_RDONLY);
    CHECK(fd >= 0, "open ring");
    struct stat st;
    fstat(fd, &st);
    struct failslow_ring_header *r = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(r != MAP_FAILED, "mmap");
    CHECK(r->write_index == 5, "init + 4 calls recorded");
    struct failslow_record rec;
    CHECK(failslow_ring_try_read(r, 5, &rec) == FAILSLOW_READ_OK, "read");
    CHECK(rec.op == FAILSLOW_OP_ALLREDUCE && rec.count == 103 && rec.nranks == 2 && rec.comm_rank == 1, "fields");
    printf("dlopen: ok (fallback to dlopen(libnccl.so.2) found the local-scope library)\n");
    return 0;
}
