/* Benchmark (c): page-fault-heavy work: map 64 MiB of anonymous memory,
 * touch every page, unmap, repeat. Prints {"ns":elapsed,"faults":pages}. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 24;
    size_t size = 64 << 20;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < rounds; r++) {
        char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 2; }
        for (size_t off = 0; off < size; off += 4096) p[off] = 1;
        munmap(p, size);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("{\"ns\":%lld,\"faults\":%zu}\n", (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec), rounds * (size / 4096));
    return 0;
}
