"""Partitioners that flwr-datasets does not ship, in its ``Partitioner`` interface."""

from __future__ import annotations

from datasets import Dataset
from flwr_datasets.partitioner import Partitioner


class RoundRobinResamplingPartitioner(Partitioner):
    """Row i goes to partition i mod num_partitions; with more partitions than rows, partition
    p holds row p mod rows (resampling), so any number of SuperNodes gets one natural client
    each (one conversation per node) and fewer nodes host several clients each."""

    def __init__(self, num_partitions: int):
        super().__init__()
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self._num_partitions = num_partitions

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def partition_indices(self, partition_id: int) -> list[int]:
        if not 0 <= partition_id < self._num_partitions:
            raise ValueError(f"partition_id {partition_id} outside [0, {self._num_partitions})")
        rows = len(self.dataset)
        if self._num_partitions >= rows:
            return [partition_id % rows]
        return list(range(partition_id, rows, self._num_partitions))

    def load_partition(self, partition_id: int) -> Dataset:
        return self.dataset.select(self.partition_indices(partition_id))
