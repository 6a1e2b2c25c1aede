"""Benchmark: one epoch of a real PyTorch DataLoader (2 workers passing
4 MiB batches through /dev/shm). Prints {"ns": elapsed of the epoch}."""
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Tensors(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.full((256, 1024), float(i))


if __name__ == "__main__":
    loader = DataLoader(Tensors(), batch_size=4, num_workers=2)
    start = time.monotonic_ns()
    total = 0.0
    for batch in loader:
        total += float(batch[0, 0, 0])
    print(json.dumps({"ns": time.monotonic_ns() - start, "sum": total}))
