/* A FUSE filesystem that stops answering: it serves one file until a flag
 * file appears, then never replies again (a hung network or FUSE mount).
 *   stuckfs serve MNT FLAG   mount at MNT and serve; prints {"server":pid}
 *   stuckfs hold FILE FLAG DIR
 *       opens FILE (on the FUSE mount) and keeps it open, creates FLAG (the
 *       server stalls from then on), then maps a 16 MiB tmpfs file in DIR
 *       and asks fallocate for it on a smaller tmpfs (ENOSPC). Prints
 *       {"pid":pid} and sleeps until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char buf[1 << 20];

static void reply(int fd, uint64_t unique, int error, const void *data, size_t n) {
    struct fuse_out_header h = { sizeof h + n, error, unique };
    char out[4096];
    memcpy(out, &h, sizeof h);
    if (n) memcpy(out + sizeof h, data, n);
    if (write(fd, out, sizeof h + n) < 0) { /* the kernel dropped it */ }
}

static void attr(struct fuse_attr *a, uint64_t node) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->mode = node == 1 ? (S_IFDIR | 0755) : (S_IFREG | 0644);
    a->nlink = 1;
    a->size = node == 1 ? 0 : 4096;
    a->blocks = node == 1 ? 0 : 8;
    a->blksize = 4096;
}

static int serve(const char *mnt, const char *flag) {
    int fd = open("/dev/fuse", O_RDWR);
    if (fd < 0) { perror("/dev/fuse"); return 2; }
    char opts[128];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
    if (mount("stuckfs", mnt, "fuse", MS_NOSUID | MS_NODEV, opts)) { perror("mount"); return 2; }
    printf("{\"server\":%d}\n", getpid());
    fflush(stdout);
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) { if (errno == EINTR || errno == ENOENT) continue; return 0; }
        struct fuse_in_header *in = (void *)buf;
        if (access(flag, F_OK) == 0) {
            for (;;) pause(); /* stuck: never answer again */
        }
        void *arg = buf + sizeof *in;
        switch (in->opcode) {
        case FUSE_INIT: {
            struct fuse_init_in *ii = arg;
            struct fuse_init_out o;
            memset(&o, 0, sizeof o);
            o.major = FUSE_KERNEL_VERSION;
            o.minor = 31;
            o.max_readahead = ii->max_readahead;
            o.max_write = 4096;
            o.time_gran = 1;
            reply(fd, in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_LOOKUP: {
            if (strcmp(arg, "file")) { reply(fd, in->unique, -ENOENT, NULL, 0); break; }
            struct fuse_entry_out o;
            memset(&o, 0, sizeof o);
            o.nodeid = 2;
            attr(&o.attr, 2);
            reply(fd, in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_GETATTR: {
            struct fuse_attr_out o;
            memset(&o, 0, sizeof o);
            attr(&o.attr, in->nodeid);
            reply(fd, in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_OPEN: {
            struct fuse_open_out o;
            memset(&o, 0, sizeof o);
            o.fh = 1;
            reply(fd, in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_FORGET:
        case FUSE_BATCH_FORGET:
        case FUSE_INTERRUPT:
            break;
        case FUSE_FLUSH:
        case FUSE_RELEASE:
            reply(fd, in->unique, 0, NULL, 0);
            break;
        default:
            reply(fd, in->unique, -ENOSYS, NULL, 0);
        }
    }
}

static int hold(const char *file, const char *flag, const char *dir) {
    int f = open(file, O_RDONLY);
    if (f < 0) { perror(file); return 2; }
    int c = open(flag, O_WRONLY | O_CREAT, 0600);
    if (c < 0) { perror(flag); return 2; }
    close(c);
    char path[512];
    snprintf(path, sizeof path, "%s/seg", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 16 << 20)) { perror(path); return 2; }
    if (mmap(NULL, 16 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED) { perror("mmap"); return 2; }
    /* Give the tracer a tick to look at our fds (and get stuck there). */
    sleep(2);
    int r = fallocate(fd, 0, 0, 16 << 20);
    printf("{\"pid\":%d,\"fallocate\":%d}\n", getpid(), r == 0 ? 0 : errno);
    fflush(stdout);
    for (;;) pause();
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "serve")) return serve(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "hold")) return hold(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: stuckfs serve MNT FLAG | hold FILE FLAG DIR\n");
    return 2;
}
