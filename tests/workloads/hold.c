/* Fills a tmpfs file of MIB MiB (write), keeps its fd, prints
 * {"pid":..,"blocks":..}, and waits until FINISH_FILE exists. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: hold PATH MIB FINISH_FILE\n"); return 2; }
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("open"); return 2; }
    static char buf[1 << 16];
    memset(buf, 1, sizeof buf);
    for (long i = 0; i < atol(argv[2]) * 16; i++)
        if (write(fd, buf, sizeof buf) != sizeof buf) { perror("write"); return 2; }
    struct stat st;
    fstat(fd, &st);
    printf("{\"pid\":%d,\"blocks\":%lld}\n", getpid(), (long long)st.st_blocks * 512);
    fflush(stdout);
    while (access(argv[3], F_OK) != 0) usleep(20000);
    return 0;
}
