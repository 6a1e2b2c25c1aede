/* Workers that fail on a full tmpfs in an order this program controls.
 *
 *   order MODE DIR NWORKERS FIRST SEGMENT_BYTES
 *
 * MODE: sigbus (mmap + touch), fallocate, write, pwrite.
 * Main forks NWORKERS workers; each opens DIR/w<i>, ftruncates (and for
 * sigbus maps) SEGMENT_BYTES, then waits for "go". Main fills DIR with a
 * ballast file until less than half a segment is free, releases worker
 * FIRST, waits for it to fail, then releases the others in index order,
 * each after the previous one failed. Prints the truth as JSON on stdout:
 * {"pids":[...],"order":[pid...]} — the kernel must see failures in that order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *mode;
static size_t seg;

static void die(const char *what) { perror(what); exit(2); }

static int worker(int idx, const char *dir, int go_fd) {
    char path[4096];
    snprintf(path, sizeof path, "%s/w%d", dir, idx);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) die("open");
    if (ftruncate(fd, (off_t)seg) != 0) die("ftruncate");
    char *p = NULL;
    if (!strcmp(mode, "sigbus")) {
        p = mmap(NULL, seg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) die("mmap");
    }
    char c;
    if (read(go_fd, &c, 1) != 1) exit(3);
    if (!strcmp(mode, "sigbus")) {
        for (size_t off = 0; off < seg; off += 4096) p[off] = 1; /* SIGBUS here */
        return 0;
    }
    if (!strcmp(mode, "fallocate")) {
        if (fallocate(fd, 0, 0, (off_t)seg) != 0) { fprintf(stderr, "w%d fallocate: %s\n", idx, strerror(errno)); return 1; }
        return 0;
    }
    static char buf[65536];
    memset(buf, 7, sizeof buf);
    for (size_t off = 0; off < seg; off += sizeof buf) {
        ssize_t n = !strcmp(mode, "pwrite") ? pwrite(fd, buf, sizeof buf, (off_t)off) : write(fd, buf, sizeof buf);
        if (n < 0) { fprintf(stderr, "w%d %s: %s\n", idx, mode, strerror(errno)); return 1; }
        if ((size_t)n < sizeof buf) { /* short write: the next one reports ENOSPC */ off -= sizeof buf - (size_t)n; }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: order MODE DIR NWORKERS FIRST SEGMENT_BYTES\n"); return 2; }
    mode = argv[1];
    const char *dir = argv[2];
    int n = atoi(argv[3]), first = atoi(argv[4]);
    seg = strtoull(argv[5], NULL, 0);
    pid_t pids[64];
    int go[64];
    for (int i = 0; i < n; i++) {
        int pfd[2];
        if (pipe(pfd)) die("pipe");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) { close(pfd[1]); exit(worker(i, dir, pfd[0])); }
        close(pfd[0]);
        pids[i] = pid;
        go[i] = pfd[1];
    }
    usleep(100000); /* let every worker set up its file */

    /* Ballast: leave less than half a segment free. */
    char bpath[4096];
    snprintf(bpath, sizeof bpath, "%s/ballast", dir);
    int b = open(bpath, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (b < 0) die("ballast");
    struct statfs st;
    if (statfs(dir, &st)) die("statfs");
    unsigned long long freeb = (unsigned long long)st.f_bavail * st.f_bsize;
    unsigned long long want = freeb > seg / 2 ? freeb - seg / 2 : 0;
    if (want && fallocate(b, 0, 0, (off_t)want)) die("ballast fallocate");

    printf("{\"pids\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", pids[i]);
    printf("],\"order\":[");
    int seq[64], m = 0;
    seq[m++] = first;
    for (int i = 0; i < n; i++)
        if (i != first) seq[m++] = i;
    for (int step = 0; step < n; step++) {
        int i = seq[step];
        if (write(go[i], "g", 1) != 1) die("go");
        int status;
        if (waitpid(pids[i], &status, 0) < 0) die("waitpid");
        printf("%s%d", step ? "," : "", pids[i]);
        fflush(stdout);
    }
    printf("]}\n");
    return 0;
}
