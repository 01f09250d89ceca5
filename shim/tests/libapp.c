/* A "framework extension" that links libnccl, loaded by the test with dlopen(RTLD_LOCAL) the way Python
 * loads torch's C extension: libnccl then sits in a local scope that dlsym(RTLD_NEXT) cannot see. */
#include "nccl_abi.h"
__attribute__((visibility("default"))) int app_allreduce(ncclComm_t *comm, int n) {
    ncclUniqueId id;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id.internal[i] = (char)(i * 7);
    if (ncclCommInitRank(comm, 2, id, 1) != ncclSuccess) return -1;
    for (int i = 0; i < n; i++)
        if (ncclAllReduce(0, 0, 100 + (size_t)i, ncclFloat32, ncclSum, *comm, 0) != ncclSuccess) return -2;
    return 0;
}
