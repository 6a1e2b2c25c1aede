"""Ray's object store (plasma) in a /dev/shm that another process fills.

Ray maps its store from a /dev/shm file it unlinks at once and sizes
sparsely (ftruncate), so nothing fails when the store starts: the raylet
dies of SIGBUS later, when its allocator first touches a page the full
tmpfs cannot give. Here a filler takes every free byte with
posix_fallocate (it does not fail itself), then ray.put() needs a new
16 MiB object. Prints {"driver": pid, "filler": pid, "filler_bytes": n}."""
import json
import os
import subprocess
import sys

import ray

ray.init(
    num_cpus=1,
    object_store_memory=100 << 20,
    _plasma_directory="/dev/shm",
    include_dashboard=False,
)
ray.put(b"x" * (1 << 20))
filler = subprocess.Popen(
    [
        sys.executable,
        "-c",
        "import os; st = os.statvfs('/dev/shm'); n = st.f_bavail * st.f_frsize; "
        "fd = os.open('/dev/shm/filler', os.O_RDWR | os.O_CREAT, 0o600); "
        "os.posix_fallocate(fd, 0, n); print(n)",
    ],
    stdout=subprocess.PIPE,
    text=True,
)
n = int(filler.communicate()[0])
print(json.dumps({"driver": os.getpid(), "filler": filler.pid, "filler_bytes": n}), flush=True)
ray.put(b"y" * (16 << 20))
print("put ok", flush=True)
