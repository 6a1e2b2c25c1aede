/* Failures on an empty /dev/shm whose cause is not its size. Usage:
 * causes MODE DIR, MODE one of:
 *   as      mmap 128 MiB of a tmpfs file under a 64 MiB RLIMIT_AS (ENOMEM)
 *   noexec  mmap a tmpfs file PROT_EXEC on a noexec mount (EPERM)
 *   fsize   write 2 MiB to a tmpfs file under a 1 MiB RLIMIT_FSIZE (EFBIG)
 *   emfile  open tmpfs files under RLIMIT_NOFILE 16 until EMFILE
 * Prints {"errno":N,"limit":L}. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static void limit(int res, rlim_t v) {
    struct rlimit r = { v, v };
    if (setrlimit(res, &r)) { perror("setrlimit"); exit(2); }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1];
    char path[512];
    snprintf(path, sizeof path, "%s/seg", argv[2]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("open"); return 2; }
    int err = 0;
    long lim = 0;
    if (!strcmp(mode, "as")) {
        if (ftruncate(fd, 128L << 20)) { perror("ftruncate"); return 2; }
        lim = 64L << 20;
        limit(RLIMIT_AS, lim);
        void *p = mmap(NULL, 128L << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        err = p == MAP_FAILED ? errno : 0;
    } else if (!strcmp(mode, "noexec")) {
        if (ftruncate(fd, 4096)) { perror("ftruncate"); return 2; }
        void *p = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
        err = p == MAP_FAILED ? errno : 0;
    } else if (!strcmp(mode, "fsize")) {
        signal(SIGXFSZ, SIG_IGN);
        lim = 1L << 20;
        limit(RLIMIT_FSIZE, lim);
        static char buf[2 << 20];
        ssize_t n = pwrite(fd, buf, sizeof buf, 1L << 20);
        err = n < 0 ? errno : 0;
    } else if (!strcmp(mode, "emfile")) {
        lim = 16;
        limit(RLIMIT_NOFILE, lim);
        for (int i = 0; i < 64; i++) {
            char p2[600];
            snprintf(p2, sizeof p2, "%s.%d", path, i);
            if (open(p2, O_RDWR | O_CREAT, 0600) < 0) { err = errno; break; }
        }
    }
    printf("{\"errno\":%d,\"limit\":%ld}\n", err, lim);
    fflush(stdout);
    /* As a program printing its error does: not gone within milliseconds.
     * (An open() that fails has no file: whether its path is on a tmpfs
     * needs the namespace's mount table, which a job gone in milliseconds
     * takes with it.) */
    usleep(300000);
    return err ? 1 : 0;
}
