/* Benchmark: tmpfs events at a set rate. Creates (O_CREAT) and closes a
 * /dev/shm file RATE times a second for SECONDS (RATE 0: as fast as it
 * can); each is one event shmtrace records (an open with O_CREAT; close
 * is not hooked).
 * Prints {"ns":elapsed,"files":n}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ref.h"

#define now ref_now

int main(int argc, char **argv) {
    long rate = argc > 1 ? atol(argv[1]) : 0;
    double secs = argc > 2 ? atof(argv[2]) : 2.0;
    long long start = now(), end = start + (long long)(secs * 1e9);
    long n = 0;
    for (;;) {
        long long t = now();
        if (t >= end) break;
        if (rate > 0 && n >= (t - start) * rate / 1000000000LL) continue;
        int fd = open("/dev/shm/bench-churn", O_RDWR | O_CREAT, 0600);
        if (fd < 0) { perror("open"); return 2; }
        close(fd);
        n++;
    }
    printf("{\"ns\":%lld,\"files\":%ld}\n", now() - start, n);
    return 0;
}
