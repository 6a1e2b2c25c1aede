/* What NCCL's intra-node shared-memory transport does (shmutils.cc,
 * ncclShmOpen), without a GPU: mkstemp("/dev/shm/nccl-XXXXXX"), then
 * posix_fallocate of the whole buffer, which fails with ENOSPC when
 * /dev/shm is too small; NCCL then warns "failed to extend ... to N bytes"
 * and returns ncclSystemError. Prints {"pid":P,"path":"...","errno":E}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long long size = argc > 1 ? atoll(argv[1]) : 32LL << 20;
    char path[] = "/dev/shm/nccl-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 2; }
    int err = posix_fallocate(fd, 0, size);
    printf("{\"pid\":%d,\"path\":\"%s\",\"errno\":%d}\n", getpid(), path, err);
    fflush(stdout);
    if (err) {
        fprintf(stderr, "NCCL WARN Error: failed to extend %s to %lld bytes\n", path, size);
        unlink(path);
        return 1;
    }
    return 0;
}
