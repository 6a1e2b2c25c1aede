"""PyPI's PyTorch (2.x): workers reserve each batch with posix_fallocate, so
a full /dev/shm fails with 'unable to allocate shared memory(shm) ... No
space left on device'. Worker 2 runs ahead; the others start 2 s later.
The main process then reports worker 0 (the batch it waits for), not the
worker that failed first.

    python dataloader_enospc.py TRUTH_FILE
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

TRUTH = sys.argv[1]
SAMPLE = 4 << 20  # float32 elements: 16 MiB a sample, 32 MiB a batch of 2


class Big(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info().id != 2:
            time.sleep(2)
        return torch.ones(SAMPLE)


def collate(batch):
    # The independent truth: when each worker's allocation failed, on
    # CLOCK_MONOTONIC (the clock eBPF timestamps use).
    try:
        return default_collate(batch)
    except RuntimeError as e:
        with open(TRUTH, "a") as f:
            f.write(f"{os.getpid()} {time.monotonic_ns()} {str(e).splitlines()[0]}\n")
        raise


if __name__ == "__main__":
    print(f"main {os.getpid()}", flush=True)
    loader = DataLoader(Big(), batch_size=2, num_workers=4, collate_fn=collate)
    kept = []
    for batch in loader:
        kept.append(batch)
        print(f"batch {len(kept)}", flush=True)
