/* Benchmark: syscall-heavy work on a non-tmpfs file: open, read, close in a
 * loop (open and close are hooked by shmtrace, read is not: every syscall
 * pays the slow path that any syscall tracepoint enables, the floor).
 * The loop runs in 100 chunks; "ns" is the fastest chunk's time times 100:
 * on a small shared VM whole stretches of a run are slowed by other work
 * (its host's), and the fastest chunk is the one least disturbed.
 * Prints {"ns":elapsed estimated so,"total_ns":wall,"ops":syscalls}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CHUNKS 100

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    const char *path = argc > 2 ? argv[2] : "/var/tmp/shmtrace-bench-syscalls";
    int init = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (init < 0 || write(init, "0123456789abcdef", 16) != 16) { perror("setup"); return 2; }
    close(init);
    char buf[16];
    long long chunk[CHUNKS], total = 0;
    for (int c = 0; c < CHUNKS; c++) {
        long long a = now();
        for (int i = 0; i < n / CHUNKS; i++) {
            int fd = open(path, O_RDONLY);
            if (fd < 0) { perror("open"); return 2; }
            if (read(fd, buf, sizeof buf) != 16) { perror("read"); return 2; }
            close(fd);
        }
        chunk[c] = now() - a;
        total += chunk[c];
    }
    qsort(chunk, CHUNKS, sizeof chunk[0], cmp);
    printf("{\"ns\":%lld,\"total_ns\":%lld,\"ops\":%d}\n", chunk[0] * CHUNKS, total, n / CHUNKS * CHUNKS * 3);
    return 0;
}
