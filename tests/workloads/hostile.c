/* A file name and a process name built to break terminals and parsers:
 * newline, ANSI escape, invalid UTF-8, a right-to-left override. Faults on
 * it in a small tmpfs. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(void) {
    prctl(PR_SET_NAME, "ev\n\x1b[2Jil", 0, 0, 0);
    const char *path = "/dev/shm/bad\n\x1b[31mname\xff\xe2\x80\xae";
    size_t size = 16 << 20;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size)) { perror("setup"); return 2; }
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t off = 0; off < size; off += 4096) p[off] = 1;
    return 0;
}
