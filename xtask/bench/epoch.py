"""Benchmark: one epoch of a real PyTorch DataLoader (2 workers passing
4 MiB batches through /dev/shm). Prints {"ns": elapsed of the epoch,
"ref_ns": a fixed amount of pure CPU work before and after, timed}: the
benchmark divides by it, so that the machine slowing down as a whole
cancels out."""
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Tensors(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.full((256, 1024), float(i))


def reference():
    start = time.monotonic_ns()
    x = 0
    for i in range(2_000_000):
        x ^= i
    return time.monotonic_ns() - start


if __name__ == "__main__":
    loader = DataLoader(Tensors(), batch_size=4, num_workers=2)
    ref = reference()
    start = time.monotonic_ns()
    total = 0.0
    for batch in loader:
        total += float(batch[0, 0, 0])
    elapsed = time.monotonic_ns() - start
    ref += reference()
    print(json.dumps({"ns": elapsed, "ref_ns": ref, "sum": total}))
