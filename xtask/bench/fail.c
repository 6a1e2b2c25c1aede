/* Benchmark: one shm failure, timed. fallocate(2) of 2 MiB on a /dev/shm
 * smaller than that fails with ENOSPC; prints the CLOCK_MONOTONIC time of
 * the failure and this pid: {"pid":P,"failed_ns":T}. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    int fd = open("/dev/shm/bench-fail", O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("open"); return 2; }
    int r = fallocate(fd, 0, 0, 2 << 20);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (r == 0 || errno != ENOSPC) { fprintf(stderr, "fallocate did not fail with ENOSPC\n"); return 2; }
    printf("{\"pid\":%d,\"failed_ns\":%lld}\n", getpid(), t.tv_sec * 1000000000LL + t.tv_nsec);
    fflush(stdout);
    /* Linger: the failure's mount table is read while a process of the
     * namespace lives. */
    usleep(300000);
    return 0;
}
