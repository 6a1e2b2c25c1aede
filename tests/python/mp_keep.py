"""torch.multiprocessing without a DataLoader: producers send tensors
through a Queue to a consumer (this process) that keeps every one. Their
storage goes through /dev/shm (file_descriptor strategy): a small /dev/shm
fills with what the consumer keeps, and a producer fails (PyTorch 2.x:
'unable to allocate shared memory(shm)' in its feeder thread; 1.13: SIGBUS).
Prints {"consumer": pid, "producers": [pids], "kept": n}."""
import json
import os
import queue
import sys
import time

import torch
import torch.multiprocessing as mp


def produce(q, n, mib):
    for i in range(n):
        q.put(torch.full((mib << 18,), float(i)))
        # The consumer keeps up: what fills /dev/shm is what it keeps.
        time.sleep(0.05)
    q.put(None)


if __name__ == "__main__":
    n, mib = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (20, 4)
    q = mp.Queue()
    procs = [mp.Process(target=produce, args=(q, n, mib)) for _ in range(2)]
    for p in procs:
        p.start()
    kept, done = [], 0
    while done < len(procs):
        try:
            t = q.get(timeout=10)
        except queue.Empty:
            break
        if t is None:
            done += 1
        else:
            kept.append(t)
    for p in procs:
        p.join(timeout=5)
    print(json.dumps({"consumer": os.getpid(), "producers": [p.pid for p in procs], "kept": len(kept)}), flush=True)
