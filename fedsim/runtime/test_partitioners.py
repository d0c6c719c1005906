import pytest
from datasets import Dataset

from fedsim.runtime.partitioners import RoundRobinResamplingPartitioner


def _partitioner(rows, parts):
    p = RoundRobinResamplingPartitioner(parts)
    p.dataset = Dataset.from_dict({"row": list(range(rows))})
    return p


def test_one_row_per_partition_when_equal():
    p = _partitioner(5, 5)
    assert [p.partition_indices(i) for i in range(5)] == [[0], [1], [2], [3], [4]]


def test_resamples_when_more_partitions_than_rows():
    p = _partitioner(3, 8)
    assert [p.partition_indices(i)[0] for i in range(8)] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert p.load_partition(4)["row"] == [1]


def test_round_robin_covers_every_row_once_when_fewer_partitions():
    p = _partitioner(10, 3)
    parts = [p.partition_indices(i) for i in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(sum(parts, [])) == list(range(10))


def test_bad_ids():
    with pytest.raises(ValueError):
        RoundRobinResamplingPartitioner(0)
    with pytest.raises(ValueError):
        _partitioner(3, 3).partition_indices(3)
