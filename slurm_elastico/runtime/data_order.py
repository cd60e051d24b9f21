"""The order in which a training job sees its data: one stream of samples, a function of the data seed only.

Sample number p of the stream is element p mod N of the permutation of epoch p // N, seeded by
(data_seed, epoch). A fixed-batch step s takes samples s·B .. (s+1)·B − 1 (`batch_indices`); in goodput
mode, whose batches differ, each step takes the next B of the same stream (`stream_indices`). Any shape,
any resume, sees the same samples.
"""

from __future__ import annotations

import torch


def batch_indices(data_seed: int, step: int, global_batch: int, dataset_len: int) -> torch.Tensor:
    """Sample indices of optimizer step `step`: epoch-wise permutations of the dataset, a function of (seed, step) only.

    Sample number p = step * global_batch + k of the stream is element
    p mod N of the permutation of epoch p // N, seeded by (data_seed, epoch).
    """
    return stream_indices(data_seed, step * global_batch, global_batch, dataset_len)


def stream_indices(data_seed: int, start: int, count: int, dataset_len: int) -> torch.Tensor:
    """Samples `start` .. `start + count - 1` of the seed's stream (`batch_indices`): goodput mode's steps,
    whose batches differ, take consecutive pieces of the same stream."""
    if dataset_len < 1:
        raise ValueError("the dataset is empty")
    pos = torch.arange(start, start + count)
    epochs = pos // dataset_len
    out = torch.empty(count, dtype=torch.long)
    for epoch in torch.unique(epochs).tolist():
        g = torch.Generator().manual_seed(data_seed * 1_000_003 + epoch)
        perm = torch.randperm(dataset_len, generator=g)
        sel = epochs == epoch
        out[sel] = perm[pos[sel] % dataset_len]
    return out
