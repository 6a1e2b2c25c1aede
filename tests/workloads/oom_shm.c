/* Kernel-internal shmem has no size limit of its own: pages of a memfd are
 * charged to the memory cgroup, and filling past its limit ends in an OOM
 * kill, not ENOSPC. Prints {"pid":..} then fills 256 MiB. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    size_t size = 256 << 20;
    int fd = memfd_create("oom_shm", 0);
    if (fd < 0 || ftruncate(fd, (off_t)size)) { perror("memfd"); return 2; }
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    printf("{\"pid\":%d}\n", getpid());
    fflush(stdout);
    for (size_t off = 0; off < size; off += 4096) p[off] = 1;
    return 0;
}
