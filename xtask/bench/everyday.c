/* Benchmark: the everyday syscalls of processes that never touch /dev/shm,
 * one kind per run, in a loop of 100 chunks, each followed by a fixed
 * amount of pure CPU work (ref.h), as syscalls.c does.
 *
 *   everyday MODE N
 *
 * MODE: write (64 bytes to /dev/null), fcntl (F_GETFL), append (100-byte
 * appends to a log file), mmap (anonymous 64 KiB mmap + munmap), socket
 * (a socketpair: send + recv), dup (dup + close of a /dev/null fd).
 * Prints {"ns":loop time,"ref_ns":CPU work time,"ops":syscalls}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ref.h"

#define CHUNKS 100

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: everyday MODE N\n"); return 2; }
    const char *mode = argv[1];
    int n = atoi(argv[2]);
    int null = open("/dev/null", O_WRONLY);
    int log = open("/var/tmp/shmtrace-bench-everyday.log", O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    int sv[2];
    if (null < 0 || log < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("setup"); return 2; }
    char buf[128];
    memset(buf, 'x', sizeof buf);
    int per = 1;
    long long total = 0, ref = 0;
    for (int c = 0; c < CHUNKS; c++) {
        long long a = ref_now();
        for (int i = 0; i < n / CHUNKS; i++) {
            if (!strcmp(mode, "write")) {
                if (write(null, buf, 64) != 64) { perror("write"); return 2; }
            } else if (!strcmp(mode, "fcntl")) {
                if (fcntl(null, F_GETFL) < 0) { perror("fcntl"); return 2; }
            } else if (!strcmp(mode, "append")) {
                if (write(log, buf, 100) != 100) { perror("append"); return 2; }
            } else if (!strcmp(mode, "mmap")) {
                void *p = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED || munmap(p, 64 << 10)) { perror("mmap"); return 2; }
                per = 2;
            } else if (!strcmp(mode, "socket")) {
                if (send(sv[0], buf, 64, 0) != 64 || recv(sv[1], buf, 64, 0) != 64) { perror("socket"); return 2; }
                per = 2;
            } else if (!strcmp(mode, "dup")) {
                int d = dup(null);
                if (d < 0 || close(d)) { perror("dup"); return 2; }
                per = 2;
            } else {
                fprintf(stderr, "unknown mode %s\n", mode);
                return 2;
            }
        }
        total += ref_now() - a;
        ref += ref_ns(1000000);
    }
    unlink("/var/tmp/shmtrace-bench-everyday.log");
    printf("{\"ns\":%lld,\"ref_ns\":%lld,\"ops\":%d}\n", total, ref, n / CHUNKS * CHUNKS * per);
    return 0;
}
