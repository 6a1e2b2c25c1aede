/* Benchmark condition: an empty BPF program (return 0) on each syscall
 * tracepoint named, attached with the kernel's own interface (bpf(2),
 * perf_event_open(2)), so that a guest with nothing but busybox can
 * measure what the kernel charges to run any program there: the cost no
 * tracer on those tracepoints can go below. Static, no libbpf.
 *
 *   empty TRACEPOINT...     e.g. empty sys_exit_write sys_exit_openat
 *
 * Prints "attached N of M" once every one it could is attached (missing
 * tracepoints are named on stderr), then waits for SIGINT or SIGTERM. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static long tracepoint_id(const char *name) {
    const char *roots[] = {"/sys/kernel/tracing", "/sys/kernel/debug/tracing"};
    for (unsigned i = 0; i < sizeof roots / sizeof *roots; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/events/syscalls/%s/id", roots[i], name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long id = -1;
        if (fscanf(f, "%ld", &id) != 1) id = -1;
        fclose(f);
        return id;
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: empty TRACEPOINT...\n"); return 2; }
    struct bpf_insn prog[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    /* Before 5.11 programs are charged to RLIMIT_MEMLOCK (64 KiB by default). */
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);
    union bpf_attr load;
    memset(&load, 0, sizeof load);
    load.prog_type = BPF_PROG_TYPE_TRACEPOINT;
    load.insns = (unsigned long)prog;
    load.insn_cnt = sizeof prog / sizeof *prog;
    load.license = (unsigned long)"GPL";
    int pfd = (int)syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof load);
    if (pfd < 0) { perror("bpf(BPF_PROG_LOAD)"); return 1; }
    int attached = 0;
    for (int i = 1; i < argc; i++) {
        long id = tracepoint_id(argv[i]);
        if (id < 0) { fprintf(stderr, "no tracepoint syscalls:%s\n", argv[i]); continue; }
        struct perf_event_attr pa;
        memset(&pa, 0, sizeof pa);
        pa.type = PERF_TYPE_TRACEPOINT;
        pa.size = sizeof pa;
        pa.config = (unsigned long long)id;
        pa.sample_period = 1;
        pa.wakeup_events = 1;
        /* One event on CPU 0 runs the program on every CPU: the program
         * hangs off the tracepoint, not the event. */
        int fd = (int)syscall(SYS_perf_event_open, &pa, -1, 0, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd < 0) { fprintf(stderr, "perf_event_open(%s): %s\n", argv[i], strerror(errno)); return 1; }
        if (ioctl(fd, PERF_EVENT_IOC_SET_BPF, pfd) || ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)) {
            fprintf(stderr, "attach %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        attached++;
    }
    printf("attached %d of %d\n", attached, argc - 1);
    fflush(stdout);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sig;
    sigwait(&set, &sig);
    return 0;
}
