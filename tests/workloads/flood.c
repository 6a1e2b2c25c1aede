/* A flood of ordinary events, then one failure. A child maps and unmaps a
 * tmpfs page N times (two events each); then the main process asks
 * fallocate for more than the tmpfs holds. Prints {"pid":main}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    pid_t child = fork();
    if (child == 0) {
        int fd = open("/dev/shm/flood", O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, 4096)) { perror("flood"); _exit(2); }
        for (int i = 0; i < n; i++) {
            void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) { perror("mmap"); _exit(2); }
            munmap(p, 4096);
        }
        _exit(0);
    }
    waitpid(child, NULL, 0);
    printf("{\"pid\":%d}\n", getpid());
    fflush(stdout);
    int fd = open("/dev/shm/big", O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("big"); return 2; }
    return fallocate(fd, 0, 0, 16 << 20) == 0 ? 0 : 1;
}
