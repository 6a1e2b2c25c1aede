/* For --pid: writes its pid to PIDFILE, waits for SIGUSR1, then forks a
 * child that fills a 16 MiB segment of /dev/shm (SIGBUS on a small one).
 * Prints {"child":pid,"status":wait status} on stdout. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t go;
static void on_usr1(int s) { (void)s; go = 1; }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: late_child PIDFILE\n"); return 2; }
    signal(SIGUSR1, on_usr1);
    FILE *f = fopen(argv[1], "w");
    if (!f) { perror("pidfile"); return 2; }
    fprintf(f, "%d\n", getpid());
    fclose(f);
    while (!go) pause();
    pid_t child = fork();
    if (child == 0) {
        size_t size = 16 << 20;
        int fd = open("/dev/shm/late", O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)size)) { perror("setup"); _exit(2); }
        char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { perror("mmap"); _exit(2); }
        for (size_t off = 0; off < size; off += 4096) p[off] = 1;
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("{\"child\":%d,\"status\":%d}\n", child, status);
    return 0;
}
