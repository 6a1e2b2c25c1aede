/* Benchmark (b): syscall-heavy work on non-tmpfs files: open, write, close
 * in a loop (every syscall pays the tracepoints shmtrace enables). The
 * write overwrites 16 bytes in the page cache: no allocation, no journal.
 * Prints {"ns":elapsed,"ops":syscalls}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    const char *path = argc > 2 ? argv[2] : "/var/tmp/shmtrace-bench-syscalls";
    int init = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (init < 0 || write(init, "0123456789abcdef", 16) != 16) { perror("setup"); return 2; }
    close(init);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
        int fd = open(path, O_WRONLY);
        if (fd < 0) { perror("open"); return 2; }
        if (write(fd, "0123456789abcdef", 16) != 16) { perror("write"); return 2; }
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    unlink(path);
    printf("{\"ns\":%lld,\"ops\":%d}\n", (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec), n * 3);
    return 0;
}
