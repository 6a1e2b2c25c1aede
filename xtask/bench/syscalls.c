/* Benchmark: syscall-heavy work on a non-tmpfs file: open, read, close in a
 * loop (open and close are hooked by shmtrace, read is not: every syscall
 * pays the slow path that any syscall tracepoint enables, the floor).
 * The loop runs in 100 chunks, each followed by a fixed amount of pure CPU
 * work (ref.h): the speed of the machine at that moment.
 * Prints {"ns":loop time,"ref_ns":CPU work time,"ops":syscalls}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ref.h"

#define CHUNKS 100

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    const char *path = argc > 2 ? argv[2] : "/var/tmp/shmtrace-bench-syscalls";
    int init = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (init < 0 || write(init, "0123456789abcdef", 16) != 16) { perror("setup"); return 2; }
    close(init);
    char buf[16];
    long long total = 0, ref = 0;
    for (int c = 0; c < CHUNKS; c++) {
        long long a = ref_now();
        for (int i = 0; i < n / CHUNKS; i++) {
            int fd = open(path, O_RDONLY);
            if (fd < 0) { perror("open"); return 2; }
            if (read(fd, buf, sizeof buf) != 16) { perror("read"); return 2; }
            close(fd);
        }
        total += ref_now() - a;
        ref += ref_ns(1000000);
    }
    printf("{\"ns\":%lld,\"ref_ns\":%lld,\"ops\":%d}\n", total, ref, n / CHUNKS * CHUNKS * 3);
    return 0;
}
