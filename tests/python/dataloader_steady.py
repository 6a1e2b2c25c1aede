"""A DataLoader in steady state, the usual training loop: each batch is used
and dropped. Its /dev/shm need is (num_workers x prefetch_factor + 1)
batches in flight; too small a /dev/shm fails (SIGBUS on Debian's torch
1.13, ENOSPC from fallocate on PyPI's torch 2.x).

    python dataloader_steady.py SAMPLE_FLOATS BATCH WORKERS BATCHES
"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE, BATCH, WORKERS, BATCHES = (int(a) for a in sys.argv[1:5])


class Samples(Dataset):
    def __len__(self):
        return BATCH * BATCHES

    def __getitem__(self, i):
        return torch.ones(SAMPLE)


if __name__ == "__main__":
    loader = DataLoader(Samples(), batch_size=BATCH, num_workers=WORKERS)
    total = 0.0
    for batch in loader:
        time.sleep(0.1)  # the training step: workers fill every prefetch slot
        total += float(batch[0, 0])
    print(f"done: {BATCHES} batches, checksum {total}", flush=True)
