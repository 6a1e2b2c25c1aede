/* Benchmark (a): a DataLoader-like workload. WORKERS workers each create a
 * /dev/shm segment (open O_EXCL, ftruncate, mmap, unlink), fill it, and pass
 * the fd over a unix socket; the main process maps it, reads it, drops it,
 * and acknowledges (two segments in flight per worker, like PyTorch's
 * prefetch_factor=2). Segment sizes cycle 1..32 MiB.
 * Prints {"ns":elapsed,"ref_ns":CPU work before and after (ref.h),"bytes":moved}. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ref.h"

#define WORKERS 4

static unsigned long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

static void send_fd(int sock, int fd, size_t size) {
    struct msghdr m = {0};
    struct iovec iov = { &size, sizeof size };
    char ctl[CMSG_SPACE(sizeof(int))];
    m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) < 0) { perror("sendmsg"); exit(2); }
}

static int recv_fd(int sock, size_t *size) {
    struct msghdr m = {0};
    struct iovec iov = { size, sizeof *size };
    char ctl[CMSG_SPACE(sizeof(int))];
    m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) <= 0) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

int main(int argc, char **argv) {
    int per_worker = argc > 1 ? atoi(argv[1]) : 48;
    int socks[WORKERS];
    long long ref = ref_ns(20000000);
    unsigned long long t0 = now(), bytes = 0;
    for (int w = 0; w < WORKERS; w++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv)) { perror("socketpair"); return 2; }
        if (fork() == 0) {
            close(sv[0]);
            for (int i = 0; i < per_worker; i++) {
                /* At most two segments in flight, like prefetch_factor=2. */
                char ack;
                if (i >= 2 && read(sv[1], &ack, 1) != 1) _exit(2);
                size_t size = (size_t)1 << (20 + (i + w) % 6);
                char name[64];
                snprintf(name, sizeof name, "/dev/shm/bench_%d_%d", getpid(), i);
                int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0 || ftruncate(fd, (off_t)size)) { perror("segment"); _exit(2); }
                char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED) { perror("mmap"); _exit(2); }
                unlink(name);
                memset(p, i, size);
                munmap(p, size);
                send_fd(sv[1], fd, size);
                close(fd);
            }
            _exit(0);
        }
        close(sv[1]);
        socks[w] = sv[0];
    }
    for (int i = 0; i < per_worker; i++) {
        for (int w = 0; w < WORKERS; w++) {
            size_t size;
            int fd = recv_fd(socks[w], &size);
            if (fd < 0) { fprintf(stderr, "worker %d gone\n", w); return 2; }
            volatile char *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) { perror("mmap"); return 2; }
            (void)p[size - 1];
            munmap((void *)p, size);
            close(fd);
            bytes += size;
            /* The worker waits for acks only before its segments 2..n-1. */
            if (i < per_worker - 2 && write(socks[w], "a", 1) != 1) { perror("ack"); return 2; }
        }
    }
    while (wait(NULL) > 0) {}
    unsigned long long t = now() - t0;
    ref += ref_ns(20000000);
    printf("{\"ns\":%llu,\"ref_ns\":%lld,\"bytes\":%llu}\n", t, ref, bytes);
    return 0;
}
