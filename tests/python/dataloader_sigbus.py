"""Debian's PyTorch 1.13: a DataLoader whose kept batches outgrow a 64 MiB
/dev/shm. Worker 1 meets the full tmpfs first (it starts its second batch
once the main process holds batches 0 and 1; worker 0 holds back its second
batch), and dies of SIGBUS while filling it.

    python3 dataloader_sigbus.py TRUTH_FILE LIBSIGBUS_TRUTH [busy]

With "busy", the order is pinned down: the main process takes batches 0
and 1 (so they stay allocated whoever dies) and enters native code (standing for a long training step) until both workers
have recorded their SIGBUS; worker 1 starts its failing batch only once the
main process is busy, and worker 0 only once worker 1 has failed. When
PyTorch finally checks, both are dead, and it names the lowest pid: worker 0.
"""
import ctypes
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

TRUTH, LIB = sys.argv[1], sys.argv[2]
BUSY = len(sys.argv) > 3 and sys.argv[3] == "busy"
BATCH = 32  # 32 x 3x256x256 float32 = 24 MiB


class Images(Dataset):
    def __len__(self):
        return BATCH * 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info.id == 1 and i == 3 * BATCH:
            # Batches 0 and 1 are complete and with the main process first.
            wait_until(lambda: os.path.exists(TRUTH + ".ready"))
        if info.id == 0 and i == 2 * BATCH:
            if BUSY:
                # Worker 1 recorded its SIGBUS and its pages are free again
                # (it may still be dying): PyTorch's first write to a new
                # segment (1 byte at its end) then succeeds, and the batch
                # dies of SIGBUS while filling, not of ENOSPC at creation.
                wait_until(lambda: os.path.exists(TRUTH) and os.path.getsize(TRUTH) > 0
                           and shm_free() >= 8 << 20)
            else:
                time.sleep(1.5)
        return torch.ones(3, 256, 256)


def shm_free():
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize


def wait_until(cond):
    for _ in range(2000):
        if cond():
            return
        time.sleep(0.01)


def init(worker_id):
    if ctypes.CDLL(LIB).install(TRUTH.encode()) != 0:
        raise OSError("cannot install the truth handler")
    with open(TRUTH + ".workers", "a") as f:
        f.write(f"{worker_id} {os.getpid()}\n")


if __name__ == "__main__":
    print(f"main {os.getpid()}", flush=True)
    loader = DataLoader(Images(), batch_size=BATCH, num_workers=2, worker_init_fn=init)
    kept = []
    for batch in loader:
        kept.append(batch)  # a training loop that keeps its batches alive
        print(f"batch {len(kept)}", flush=True)
        if len(kept) == 2:
            open(TRUTH + ".ready", "w").close()
        if BUSY and len(kept) == 2:
            # Native code until both workers' handlers have recorded their
            # SIGBUS: Python runs no signal handler until it returns.
            ctypes.CDLL(LIB).wait_records(TRUTH.encode(), 2, 20000, 500)
