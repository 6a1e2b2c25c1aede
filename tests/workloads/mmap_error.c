/* mmap of a tmpfs file fails: 1 GiB asked under a 256 MiB address-space
 * limit. Prints {"errno":..}. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

int main(void) {
    int fd = open("/dev/shm/big", O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 1L << 30)) { perror("setup"); return 2; }
    struct rlimit r = { 256L << 20, 256L << 20 };
    if (setrlimit(RLIMIT_AS, &r)) { perror("setrlimit"); return 2; }
    void *p = mmap(NULL, 1L << 30, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    printf("{\"errno\":%d}\n", p == MAP_FAILED ? errno : 0);
    fflush(stdout);
    /* Lingers as a program printing its error does, unless NO_LINGER: then
     * gone (namespace and all) within milliseconds. */
    if (!getenv("NO_LINGER")) usleep(300000);
    return p == MAP_FAILED ? 1 : 0;
}
