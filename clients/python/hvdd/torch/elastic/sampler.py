"""Horovod's ``horovod/torch/elastic/sampler.py``: a sampler that repartitions
the rest of an epoch over the ranks after a reset."""

from __future__ import annotations

import math
import random
from typing import Any, Dict, Iterator, List

import torch.utils.data

from ...basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Sampler that partitions dataset across ranks and repartitions after reset events.

    Works similar to `DistributedSampler`, but with an optional capability to record
    which dataset indices have been processed each batch. When tracked by a `TorchState`
    object, the sampler will automatically repartition the unprocessed indices among the
    new set of workers.

    In order to use this object successfully it is recommended that the user:

    1. Include this object in the `TorchState`.
    2. Call `record_batch` after processing a set of samples.
    3. Call `set_epoch` at the end of each epoch to clear the processed indices.

    Args:
        dataset: Dataset used for sampling (assumed to be of constant size).
        shuffle: If `True` (default), shuffle the indices.
        seed: Random seed used to shuffle the sampler when `shuffle=True`.
              This number should be identical across all ranks (default: 0).
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

        self.epoch = 0
        self.processed_num = 0

        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0

        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch for this sampler.

        When `shuffle=True`, this ensures all replicas use a different random ordering
        for each epoch.

        Will clear and reset the processed samples for the next epoch. It is important
        that this is called at the end of the epoch (not the beginning) to ensure that
        partially completed epochs do not reprocess samples.

        Args:
            epoch: Epoch number.
        """
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record the number of processed samples: a batch of `batch_size` on
        every rank."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> Dict[str, Any]:
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self) -> None:
        """Partitions the epoch's unprocessed indices over the current ranks
        (``size()`` and ``rank()``, re-read: they change across a reset)."""
        self.num_replicas = size()
        self.rank = rank()

        # Exclude any samples we have already processed this epoch. Every rank
        # shuffles the same way, and ranks take interleaved positions, so the
        # first processed_num indices are exactly those processed.
        all_indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(all_indices)
        self.remaining_indices = all_indices[self.processed_num :]

        self.num_samples = int(math.ceil(len(self.remaining_indices) * 1.0 / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        self.indices = self.remaining_indices[:]

        # add extra samples to make it evenly divisible (repeated as often as
        # needed: fewer remain than there are ranks near an epoch's end)
        padding = self.total_size - len(self.indices)
        if padding > 0:
            self.indices += (self.indices * math.ceil(padding / len(self.indices)))[:padding]
        assert len(self.indices) == self.total_size

        # subsample
        self.indices = self.indices[self.rank : self.total_size : self.num_replicas]
        assert len(self.indices) == self.num_samples

        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
