/* Creates files in /dev/shm, shm_open style, until the tmpfs inode limit
 * stops it. Prints {"pid":..,"path":..,"errno":..} for the failing open. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    char path[64];
    for (int i = 0; i < 1000; i++) {
        snprintf(path, sizeof path, "/dev/shm/seg%d", i);
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            printf("{\"pid\":%d,\"path\":\"%s\",\"errno\":%d}\n", getpid(), path, errno);
            fflush(stdout);
            /* Real programs report and clean up before exiting; an open()
             * failure is classified by its path, which needs the namespace's
             * mount table while one of its processes is alive (README). */
            usleep(300000);
            return 1;
        }
    }
    printf("{\"errno\":0}\n");
    return 0;
}
