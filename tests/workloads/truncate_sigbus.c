/* SIGBUS that is not a full tmpfs: map two pages of DIR/f, truncate the
 * file to zero, touch the mapping. Prints {"pid":..} first. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: truncate_sigbus DIR\n"); return 2; }
    char path[4096];
    snprintf(path, sizeof path, "%s/truncated", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("open"); return 2; }
    char buf[8192];
    memset(buf, 1, sizeof buf);
    if (write(fd, buf, sizeof buf) != sizeof buf) { perror("write"); return 2; }
    char *p = mmap(NULL, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    printf("{\"pid\":%d}\n", getpid());
    fflush(stdout);
    if (ftruncate(fd, 0)) { perror("ftruncate"); return 2; }
    p[4096] = 2; /* SIGBUS: past the end of the file */
    return 0;
}
