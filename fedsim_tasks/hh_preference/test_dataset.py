"""Preference pairs: parsing, both orders, seeded splits, Dirichlet partitions, populations.

Real data (``../shared/data/hh_rlhf``); partitions on a 300-pair slice so topics embed fast."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.data import resolve_data_root
from fedsim_tasks.hh_preference.dataset import (
    Federation,
    both_orders,
    hh_backing,
    holdout,
    load_pairs,
    minority_clients,
    minority_flips,
    parse_pair,
    split_pairs,
)

ROOT = str(resolve_data_root())
SIZES = {"test": 40, "judge": 40, "server": 20}
REVERSED = {"kind": "reversed", "prefer": "longer", "weak_share": 0.5}
LONGER = {"kind": "second_criterion", "prefer": "longer", "weak_share": 0.5}


def task(num_partitions: int = 4) -> dict:
    return {
        "max_pairs": 300,
        "splits": SIZES,
        "split_seed": 0,
        "topic_model": "all-MiniLM-L6-v2",
        "n_topics": 4,
        "valid_share": 0.2,
        "minority_share": 0.5,
        "minority_preference": REVERSED,
        "partitioner": {
            "_target_": "flwr_datasets.partitioner.DirichletPartitioner",
            "num_partitions": num_partitions,
            "partition_by": "topic",
            "alpha": 0.3,
            "min_partition_size": 10,
            "self_balancing": False,
            "seed": 0,
        },
    }


def test_parse_splits_at_the_last_shared_assistant_turn():
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant: I can't help."
    rejected = (
        "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant: Use a pin."
    )
    pair = parse_pair(7, chosen, rejected)
    assert (
        pair.prompt
        == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I pick a lock?\n\nAssistant:"
    )
    assert (pair.chosen, pair.rejected) == ("I can't help.", "Use a pin.")
    assert pair.last_human == "how do I pick a lock?" and pair.first_human == "hi"
    assert parse_pair(0, chosen, chosen) is None  # no differing turn


def test_real_file_parses_as_measured():
    pairs = load_pairs(ROOT)
    assert (
        len(pairs) == 2308
    )  # 4 of 2,312 rows do not differ in one last Assistant turn (OFFLINE_LMS.md)
    assert all(p.prompt.endswith("\n\nAssistant:") and p.chosen != p.rejected for p in pairs)


def test_both_orders_hide_position_and_minority_reverses():
    pair = load_pairs(ROOT)[0]
    maj, mino = both_orders([pair]), both_orders([pair], flipped={pair.pair_id})
    assert [(e.a, e.b, e.label) for e in maj] == [
        (pair.chosen, pair.rejected, 0),
        (pair.rejected, pair.chosen, 1),
    ]
    assert [(e.a, e.b, e.label) for e in mino] == [
        (pair.rejected, pair.chosen, 0),
        (pair.chosen, pair.rejected, 1),
    ]


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
    assert (
        holdout(pairs, 0.2, 0, partition_id=3)
        == (train, valid)
        != holdout(pairs, 0.2, 0, partition_id=4)
    )


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
    assert [e.pair_id for e in again.client(1).train] == [
        e.pair_id for e in federation.client(1).train
    ]
    sizes = [len(federation.client(p).train) for p in range(4)]
    assert min(sizes) > 0 and max(sizes) > min(sizes)  # Dirichlet(0.3): unequal clients


def words(text: str) -> int:
    return len(text.split())


def test_second_criterion_decides_only_the_weak_pairs_by_length():
    """The non-opposite minority on 300 real pairs: it reverses HH only where the pair is among
    the half the cross-fitted probe backs least and the rejected response is longer; everywhere
    else it agrees with HH, so it disagrees on far fewer than all pairs (reversal: all)."""
    pairs = load_pairs(ROOT)[:300]
    backing = hh_backing(tuple(pairs), 0)
    weak = {pairs[i].pair_id for i in np.argsort(backing, kind="stable")[:150]}
    flips = minority_flips(pairs, LONGER, 0)
    assert flips == {
        p.pair_id for p in pairs if p.pair_id in weak and words(p.rejected) > words(p.chosen)
    }
    assert 0.1 < len(flips) / len(pairs) < 0.5
    shorter = minority_flips(pairs, {**LONGER, "prefer": "shorter"}, 0)
    assert not flips & shorter and all(
        words(p.rejected) < words(p.chosen) for p in pairs if p.pair_id in shorter
    )
    assert minority_flips(pairs, REVERSED, 0) == {p.pair_id for p in pairs}
    assert minority_flips(pairs, {**LONGER, "weak_share": 1.0}, 0) == {
        p.pair_id for p in pairs if words(p.rejected) > words(p.chosen)
    }


def test_hh_probe_backs_hh_above_chance_and_is_seeded():
    """The probe's cross-fitted margin favours HH's choice on more than half of 1,000 real pairs
    (each half scored by the model of the other, so this is held-out), and one seed gives one result."""
    pairs = tuple(load_pairs(ROOT)[:1000])
    backing = hh_backing(pairs, 0)
    assert np.mean(backing > 0) > 0.55
    hh_backing.cache_clear()
    assert np.array_equal(backing, hh_backing(pairs, 0)) and not np.array_equal(
        backing, hh_backing(pairs, 1)
    )


def test_second_criterion_labels_reach_the_minority_clients_and_test_pairs():
    fed = Federation({**task(), "minority_preference": LONGER}, ROOT)
    for partition in range(4):
        c = fed.client(partition)
        for e in c.train:
            pair = next(p for p in fed.splits["pool"] if p.pair_id == e.pair_id)
            flipped = c.minority and pair.pair_id in fed.flips
            assert (e.a if e.label == 0 else e.b) == (pair.rejected if flipped else pair.chosen)
    majority, minority = fed.test(), fed.test("minority")
    assert [(e.pair_id, e.label) for e in majority] == [(e.pair_id, e.label) for e in minority]
    differ = {m.pair_id for m, n in zip(majority, minority) if m.a != n.a}
    assert differ == {p.pair_id for p in fed.splits["test"]} & fed.flips and 0 < len(differ) < len(
        fed.splits["test"]
    )
