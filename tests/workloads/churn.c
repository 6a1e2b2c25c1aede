/* Process churn: N short-lived processes, each exec'd with a 64 KiB
 * command line, creating, filling and unlinking a 4 KiB tmpfs file in DIR,
 * 8 at a time. Usage: churn N DIR. Prints {"done":N}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc > 3 && !strcmp(argv[1], "-c")) {
        char path[512];
        snprintf(path, sizeof path, "%s/c%d", argv[2], getpid());
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return 2;
        static char page[4096];
        if (write(fd, page, sizeof page) < 0) return 2;
        unlink(path);
        return 0;
    }
    if (argc < 3) return 2;
    long n = atol(argv[1]);
    static char big[64 << 10];
    memset(big, 'a', sizeof big - 1);
    char *args[] = { argv[0], "-c", argv[2], big, NULL };
    long running = 0;
    for (long i = 0; i < n; i++) {
        if (running == 8) { wait(NULL); running--; }
        pid_t p = fork();
        if (p == 0) { execv("/proc/self/exe", args); _exit(127); }
        if (p > 0) running++;
    }
    while (running-- > 0) wait(NULL);
    printf("{\"done\":%ld}\n", n);
    return 0;
}
