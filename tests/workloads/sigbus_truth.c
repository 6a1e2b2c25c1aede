/* Loaded into DataLoader workers (ctypes, from worker_init_fn): records
 * when the kernel's SIGBUS reached the worker, on CLOCK_MONOTONIC (the
 * clock eBPF timestamps use), independently of shmtrace. Then it puts back
 * the previous handler (PyTorch's) and returns, so the access faults again
 * and the worker dies the way it would have. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int out = -1;
static struct sigaction previous;

static char *num(char *p, unsigned long long v, int base) {
    char tmp[32];
    int n = 0;
    do { tmp[n++] = "0123456789abcdef"[v % base]; v /= base; } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char line[96], *p = line;
    p = num(p, (unsigned long long)getpid(), 10); *p++ = ' ';
    p = num(p, (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec, 10); *p++ = ' ';
    p = num(p, (unsigned long long)(unsigned long)si->si_addr, 16); *p++ = '\n';
    if (write(out, line, (size_t)(p - line)) < 0) { /* nothing to do in a handler */ }
    sigaction(SIGBUS, &previous, NULL);
}

int install(const char *path) {
    out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &previous);
}

/* Blocks in native code (so Python runs no signal handler meanwhile) until
 * PATH holds N records or TIMEOUT_MS passes, then SETTLE_MS more (a worker
 * records its SIGBUS before it dies of it). Returns the records seen. */
int wait_records(const char *path, int n, int timeout_ms, int settle_ms) {
    int lines = 0;
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        lines = 0;
        if (fd >= 0) {
            char buf[4096];
            ssize_t got;
            while ((got = read(fd, buf, sizeof buf)) > 0)
                for (ssize_t i = 0; i < got; i++) lines += buf[i] == '\n';
            close(fd);
        }
        if (lines >= n) break;
        usleep(10000); /* a signal may cut it short: the loop goes on */
    }
    for (int waited = 0; waited < settle_ms; waited += 10) usleep(10000);
    return lines;
}
