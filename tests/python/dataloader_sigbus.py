"""Debian's PyTorch 1.13: a DataLoader whose kept batches outgrow a 64 MiB
/dev/shm. Worker 1 meets the full tmpfs first (worker 0 holds back its
second batch), and dies of SIGBUS while filling its batch.

    python3 dataloader_sigbus.py TRUTH_FILE LIBSIGBUS_TRUTH [busy]

With "busy", the main process is in a long native computation (a training
step) when worker 1 dies, and worker 0 dies soon after: by the time PyTorch
checks, both are dead, and it names the lowest pid, worker 0.
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
        if info.id == 0 and i == 2 * BATCH:
            time.sleep(0.6 if BUSY else 1.5)
        return torch.ones(3, 256, 256)


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
        if BUSY and len(kept) == 1:
            # One long native call (about 3 s here), started before worker 1
            # can fail: Python runs no signal handler until it returns.
            x = torch.ones(1800, 1800)
            torch.mm(x, x)
