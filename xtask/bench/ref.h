/* A fixed amount of pure CPU work, timed: the benchmark divides each
 * workload's time by it, so that a small shared VM slowing down as a whole
 * (its host's load) cancels out of the ratios. No syscalls inside: no
 * tracer changes its cost. */
#include <time.h>

__attribute__((unused)) static long long ref_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((unused)) static long long ref_ns(long iterations) {
    volatile unsigned long long sink;
    unsigned long long x = 88172645463325252ULL;
    long long a = ref_now();
    for (long i = 0; i < iterations; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    }
    sink = x;
    (void)sink;
    return ref_now() - a;
}
