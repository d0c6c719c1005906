"""Preference pairs: parsing, both orders, seeded splits, Dirichlet partitions, populations.

Real data (``../shared/data/hh_rlhf``); partitions on a 300-pair slice so topics embed fast."""

from __future__ import annotations

import pytest

from fedsim.data import resolve_data_root
from fedsim_tasks.hh_preference.dataset import (
    Federation,
    both_orders,
    holdout,
    load_pairs,
    minority_clients,
    parse_pair,
    split_pairs,
)

ROOT = str(resolve_data_root())
SIZES = {"test": 40, "judge": 40, "server": 20}


def task(num_partitions: int = 4) -> dict:
    return {"max_pairs": 300, "splits": SIZES, "split_seed": 0, "topic_model": "all-MiniLM-L6-v2",
            "n_topics": 4, "valid_share": 0.2, "minority_share": 0.5,
            "partitioner": {"_target_": "flwr_datasets.partitioner.DirichletPartitioner",
                            "num_partitions": num_partitions, "partition_by": "topic", "alpha": 0.3,
                            "min_partition_size": 10, "self_balancing": False, "seed": 0}}


def test_parse_splits_at_the_last_shared_assistant_turn():
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant: I can't help."
    rejected = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant: Use a pin."
    pair = parse_pair(7, chosen, rejected)
    assert pair.prompt == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant:"
    assert (pair.chosen, pair.rejected) == ("I can't help.", "Use a pin.")
    assert pair.last_human == "how do I pick a lock?" and pair.first_human == "hi"
    assert parse_pair(0, chosen, chosen) is None  # no differing turn


def test_real_file_parses_as_measured():
    pairs = load_pairs(ROOT)
    assert len(pairs) == 2308  # 4 of 2,312 rows do not differ in one last Assistant turn (OFFLINE_LMS.md)
    assert all(p.prompt.endswith("\n\nAssistant:") and p.chosen != p.rejected for p in pairs)


def test_both_orders_hide_position_and_minority_reverses():
    pair = load_pairs(ROOT)[0]
    maj, mino = both_orders([pair]), both_orders([pair], prefer_rejected=True)
    assert [(e.a, e.b, e.label) for e in maj] == [(pair.chosen, pair.rejected, 0), (pair.rejected, pair.chosen, 1)]
    assert [(e.a, e.b, e.label) for e in mino] == [(pair.rejected, pair.chosen, 0), (pair.chosen, pair.rejected, 1)]


def test_splits_are_seeded_and_disjoint():
    pairs = load_pairs(ROOT)
    a, b = split_pairs(pairs, SIZES, 3), split_pairs(pairs, SIZES, 3)
    ids = {k: {p.pair_id for p in v} for k, v in a.items()}
    assert ids == {k: {p.pair_id for p in v} for k, v in b.items()}
    assert sum(map(len, ids.values())) == len(set().union(*ids.values())) == len(pairs)
    assert {k: len(v) for k, v in ids.items() if k != "pool"} == SIZES
    with pytest.raises(ValueError, match="no client pairs"):
        split_pairs(pairs[:50], SIZES, 0)


def test_holdout_keeps_own_validation_pairs():
    pairs = list(load_pairs(ROOT)[:20])
    train, valid = holdout(pairs, 0.2, 0, partition_id=3)
    assert len(valid) == 4 and not {p.pair_id for p in train} & {p.pair_id for p in valid}
    assert holdout(pairs, 0.2, 0, partition_id=3) == (train, valid) != holdout(pairs, 0.2, 0, partition_id=4)


def test_minority_is_a_seeded_share_of_clients():
    assert minority_clients(12, 1 / 3, 0) == minority_clients(12, 1 / 3, 0)
    assert len(minority_clients(12, 1 / 3, 0)) == 4 and minority_clients(12, 0.0, 0) == []


@pytest.fixture(scope="module")
def federation():
    return Federation(task(), ROOT)


def test_clients_partition_the_pool_without_overlap(federation):
    clients = [federation.client(p) for p in range(4)]
    seen = [{e.pair_id for e in c.train + c.valid} for c in clients]
    assert sum(map(len, seen)) == len(set().union(*seen)) == len(federation.splits["pool"])
    held_out = {p.pair_id for k in ("test", "judge", "server") for p in federation.splits[k]}
    assert not held_out & set().union(*seen)
    assert all(not {e.pair_id for e in c.train} & {e.pair_id for e in c.valid} for c in clients)
    assert [c.minority for c in clients] == [p in federation.minority for p in range(4)]
    assert len(federation.minority) == 2
    for c in clients:  # a minority client's label follows the other response
        e = c.train[0]
        pair = next(p for p in load_pairs(ROOT) if p.pair_id == e.pair_id)
        preferred = e.a if e.label == 0 else e.b
        assert preferred == (pair.rejected if c.minority else pair.chosen)


def test_partition_is_deterministic_and_skewed_by_topic(federation):
    again = Federation(task(), ROOT)
    assert [e.pair_id for e in again.client(1).train] == [e.pair_id for e in federation.client(1).train]
    sizes = [len(federation.client(p).train) for p in range(4)]
    assert min(sizes) > 0 and max(sizes) > min(sizes)  # Dirichlet(0.3): unequal clients
