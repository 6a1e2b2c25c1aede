/* Noise that must not hide a real failure. A child sends itself N SIGBUS
 * it ignores (kill(getpid(), SIGBUS)), then faults M times on a mapping
 * past the end of a truncated file, recovering each time with a handler
 * that jumps back (real faults, BUS_ADRERR, none a full tmpfs). Then the
 * main process asks fallocate for more than the tmpfs holds: the real
 * failure. Prints {"pid":main,"noise":child}. Usage: sigbus_flood DIR N M */
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static sigjmp_buf back;
static void on_bus(int sig) { (void)sig; siglongjmp(back, 1); }

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm";
    long n = argc > 2 ? atol(argv[2]) : 200000;
    long m = argc > 3 ? atol(argv[3]) : 20000;
    char path[512];
    pid_t child = fork();
    if (child == 0) {
        signal(SIGBUS, SIG_IGN);
        for (long i = 0; i < n; i++) kill(getpid(), SIGBUS);
        snprintf(path, sizeof path, "%s/short", dir);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, 4096)) { perror("short"); _exit(2); }
        volatile char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { perror("mmap"); _exit(2); }
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_bus;
        sigaction(SIGBUS, &sa, NULL);
        for (volatile long i = 0; i < m; i++) {
            if (sigsetjmp(back, 1) == 0) p[4096] = 1; /* past the end: SIGBUS */
        }
        unlink(path);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    printf("{\"pid\":%d,\"noise\":%d}\n", getpid(), child);
    fflush(stdout);
    snprintf(path, sizeof path, "%s/real", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("real"); return 2; }
    return fallocate(fd, 0, 0, 64 << 20) == 0 ? 0 : 1;
}
