"""A /dev/shm filled by another file breaks multiprocessing's locks: each
SemLock is a POSIX named semaphore, a page in /dev/shm (glibc's sem_open
writes it into a fresh sem.XXXXXX file before linking it to its name).
Fills the mount with posix_fallocate, then makes a multiprocessing.Lock;
prints {"pid": ..., "filler_bytes": ...} and fails with
OSError: [Errno 28] No space left on device."""
import json
import multiprocessing
import os

st = os.statvfs("/dev/shm")
size = st.f_blocks * st.f_frsize
fd = os.open("/dev/shm/filler", os.O_RDWR | os.O_CREAT, 0o600)
os.posix_fallocate(fd, 0, size)
print(json.dumps({"pid": os.getpid(), "filler_bytes": size}), flush=True)
multiprocessing.Lock()
