/* Three processes holding tmpfs bytes three ways, for attribution:
 *   P1 creates, fills (write) and unlinks a1..a3 (1, 2, 3 MiB), keeps the fds,
 *      and sends a2's fd to P2 over a unix socket;
 *   P2 maps the received fd and closes it (holds a2 by its mapping only);
 *   P3 creates and fills a named file (4 MiB) and keeps its fd;
 *   P4 receives a3's fd from P1 and only holds it (no mapping, no syscall
 *      on it: only the recvmsg shows it).
 * When all are set up, the main process prints the truth (pids, each file's
 * st_blocks, statfs use) as JSON, then everyone waits until FINISH_FILE
 * exists. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *finish;

static void wait_finish(void) {
    while (access(finish, F_OK) != 0) usleep(20000);
}

static int make(const char *path, size_t size, int unlink_it) {
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) { perror(path); exit(2); }
    static char buf[65536];
    memset(buf, 1, sizeof buf);
    for (size_t off = 0; off < size; off += sizeof buf)
        if (write(fd, buf, sizeof buf) != sizeof buf) { perror("write"); exit(2); }
    if (unlink_it) unlink(path);
    return fd;
}

static void send_fd(int sock, int fd) {
    struct msghdr m = {0};
    char byte = 'f';
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int))];
    m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) < 0) { perror("sendmsg"); exit(2); }
}

static int recv_fd(int sock) {
    struct msghdr m = {0};
    char byte;
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int))];
    m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) <= 0) { perror("recvmsg"); exit(2); }
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

static long long blocks(int fd) {
    struct stat st;
    fstat(fd, &st);
    return (long long)st.st_blocks * 512;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: holders FINISH_FILE\n"); return 2; }
    finish = argv[1];
    int sv[2], sv4[2], ready[2], report[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) || socketpair(AF_UNIX, SOCK_DGRAM, 0, sv4) || pipe(ready) || pipe(report)) {
        perror("setup");
        return 2;
    }
    pid_t p1 = fork();
    if (p1 == 0) {
        int a1 = make("/dev/shm/a1", 1 << 20, 1), a2 = make("/dev/shm/a2", 2 << 20, 1), a3 = make("/dev/shm/a3", 3 << 20, 1);
        send_fd(sv[0], a2);
        send_fd(sv4[0], a3);
        long long b[3] = { blocks(a1), blocks(a2), blocks(a3) };
        if (write(report[1], b, sizeof b) != sizeof b) exit(2);
        wait_finish();
        _exit(0);
    }
    pid_t p2 = fork();
    if (p2 == 0) {
        int fd = recv_fd(sv[1]);
        void *p = mmap(NULL, 2 << 20, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { perror("mmap"); exit(2); }
        close(fd);
        if (write(ready[1], "2", 1) != 1) exit(2);
        wait_finish();
        _exit(0);
    }
    pid_t p4 = fork();
    if (p4 == 0) {
        int fd = recv_fd(sv4[1]);
        (void)fd; /* held, never used */
        if (write(ready[1], "4", 1) != 1) exit(2);
        wait_finish();
        _exit(0);
    }
    pid_t p3 = fork();
    if (p3 == 0) {
        int fd = make("/dev/shm/named", 4 << 20, 0);
        long long b = blocks(fd);
        if (write(report[1], &b, sizeof b) != sizeof b) exit(2);
        wait_finish();
        _exit(0);
    }
    long long b1[3], b3;
    char c;
    /* P1 and P3 write their sizes in either order: P1 sends 24 bytes, P3 8. */
    char buf[32];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t n = read(report[0], buf + got, sizeof buf - got);
        if (n <= 0) { perror("report"); return 2; }
        got += (size_t)n;
    }
    if (read(ready[0], &c, 1) != 1 || read(ready[0], &c, 1) != 1) return 2;
    /* Pipe writes of <= PIPE_BUF are atomic: find which block is whose. */
    if (((long long *)buf)[0] == 4 << 20 && ((long long *)buf)[1] != 4 << 20) {
        b3 = ((long long *)buf)[0];
        memcpy(b1, buf + 8, 24);
    } else {
        memcpy(b1, buf, 24);
        b3 = ((long long *)buf)[3];
    }
    struct statfs st;
    statfs("/dev/shm", &st);
    printf("{\"p1\":%d,\"p2\":%d,\"p3\":%d,\"p4\":%d,\"a1\":%lld,\"a2\":%lld,\"a3\":%lld,\"named\":%lld,\"used\":%lld}\n",
           p1, p2, p3, p4, b1[0], b1[1], b1[2], b3, (long long)(st.f_blocks - st.f_bfree) * st.f_bsize);
    fflush(stdout);
    wait_finish();
    while (wait(NULL) > 0) {}
    return 0;
}
