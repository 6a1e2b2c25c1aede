"""Fills a small /dev/shm through sendfile, splice and copy_file_range, one
method at a time (each file removed before the next), printing the errno
each one met: shmtrace must see every one as a tmpfs failure.

    python3 copy_into_tmpfs.py      # in a private /dev/shm of 8 MiB
"""
import errno
import json
import os

MIB = 1 << 20
out = {}


def fill(name, copy):
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for _ in range(256):
            copy(fd)
        out[name] = "no error"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
    finally:
        os.close(fd)
        os.unlink(path)


# A source outside /dev/shm for sendfile.
src = "/tmp/shmtrace-copy-src-%d" % os.getpid()
with open(src, "wb") as f:
    f.write(b"\0" * MIB)
sfd = os.open(src, os.O_RDONLY)
fill("sendfile", lambda fd: os.sendfile(fd, sfd, 0, MIB))
os.close(sfd)
os.unlink(src)

r, w = os.pipe()


def spliced(fd):
    os.write(w, b"\0" * 65536)
    os.splice(r, fd, 65536)


fill("splice", spliced)

# copy_file_range within the tmpfs (across filesystems it may be refused).
with open("/dev/shm/cfr-src", "wb") as f:
    f.write(b"\1" * (2 * MIB))
cfd = os.open("/dev/shm/cfr-src", os.O_RDONLY)
fill("copy_file_range", lambda fd: os.copy_file_range(cfd, fd, 2 * MIB, 0))
print(json.dumps(out), flush=True)
