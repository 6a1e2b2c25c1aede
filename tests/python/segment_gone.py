"""A segment removed before its consumer opens it, the way a cleanup job
(`rm -f /dev/shm/...`) does it to a running job.

  segment_gone.py psm     Python's multiprocessing.shared_memory: the
                          consumer's SharedMemory(name=...) raises
                          FileNotFoundError.
  segment_gone.py torch   torch.multiprocessing with the file_system
                          sharing strategy: a producer puts a tensor on a
                          Queue (its segment keeps a /dev/shm name), the
                          names are removed, and the consumer's get()
                          raises 'unable to open shared memory object'.
  segment_gone.py probe   attach-or-create: SharedMemory(name) fails, the
                          process creates the name itself (no failure).

Prints {"consumer": pid, "remover": pid, "name": ...} before failing."""
import glob
import json
import os
import subprocess
import sys


def remove(paths):
    rm = subprocess.Popen(["rm", "-f", "--", *paths])
    rm.wait()
    return rm.pid


def psm():
    from multiprocessing import shared_memory

    seg = shared_memory.SharedMemory(name="psm_job42", create=True, size=1 << 20)
    seg.buf[:4] = b"data"
    pid = remove(["/dev/shm/psm_job42"])
    print(json.dumps({"consumer": os.getpid(), "remover": pid, "name": "psm_job42"}), flush=True)
    shared_memory.SharedMemory(name="psm_job42")


def torch_file_system():
    import torch
    import torch.multiprocessing as mp

    def produce(q, done):
        q.put(torch.ones(1 << 18))
        done.wait()

    mp.set_sharing_strategy("file_system")
    q, done = mp.Queue(), mp.Event()
    p = mp.Process(target=produce, args=(q, done))
    p.start()
    # The tensor is on the Queue once its segment exists.
    while not glob.glob("/dev/shm/torch_*"):
        pass
    names = glob.glob("/dev/shm/torch_*")
    pid = remove(names)
    print(json.dumps({"consumer": os.getpid(), "remover": pid,
                      "name": os.path.basename(names[0])}), flush=True)
    try:
        q.get(timeout=30)
    finally:
        done.set()
        p.join()


def probe():
    from multiprocessing import shared_memory

    try:
        seg = shared_memory.SharedMemory(name="psm_probe")
    except FileNotFoundError:
        seg = shared_memory.SharedMemory(name="psm_probe", create=True, size=1 << 16)
    seg.buf[:4] = b"data"
    seg.close()
    seg.unlink()
    print(json.dumps({"consumer": os.getpid(), "remover": 0, "name": "psm_probe"}), flush=True)


if __name__ == "__main__":
    {"psm": psm, "torch": torch_file_system, "probe": probe}[sys.argv[1]]()
