"""The cross-device workload of bench/simulation_peers.py on the real Topical-Chat turns."""

import numpy as np
import pytest

from fedsim.config.data import resolve_data_root
from fedsim_tasks.topical_chat.turn_sentiment import (
    SENTIMENTS,
    WEIGHT_NAMES,
    Recipe,
    client_rows,
    load_turns,
)

ROOT = str(resolve_data_root())
TASK = {
    "train_splits": ["valid_rare"],
    "test_splits": ["test_rare"],
    "features": 64,
    "hidden": 8,
    "batch_size": 8,
    "lr": 0.1,
}


def test_labels_are_the_annotated_sentiments_and_features_are_stateless():
    turns = load_turns(ROOT, ("valid_rare",), 64)
    assert len(turns) == len(turns.x) > 10_000 and set(np.unique(turns.y)) <= set(
        range(len(SENTIMENTS))
    )
    assert np.allclose(np.linalg.norm(turns.x[:100], axis=1), 1.0, atol=1e-5)
    both = load_turns(ROOT, ("valid_rare", "test_rare"), 64)
    assert np.array_equal(
        both.x[: len(turns)], turns.x
    )  # a turn's features do not depend on the others'


@pytest.mark.parametrize("num_clients", [1, 7, 1000, 11_000])
def test_clients_hold_disjoint_consecutive_slices_covering_every_turn(num_clients):
    rows = [client_rows(11_000, num_clients, c) for c in range(num_clients)]
    assert np.array_equal(np.concatenate(rows), np.arange(11_000))
    sizes = [len(r) for r in rows]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("num_clients, client", [(0, 0), (11_001, 0), (10, 10), (10, -1)])
def test_a_client_outside_the_population_is_refused(num_clients, client):
    with pytest.raises(ValueError):
        client_rows(11_000, num_clients, client)


def test_local_update_is_seeded_by_round_and_client_and_learns():
    recipe = Recipe.of(TASK, ROOT)
    start = recipe.initial(seed=0)
    assert [w.shape for w in start] == [(8, 64), (8,), (len(SENTIMENTS), 8), (len(SENTIMENTS),)]
    assert len(WEIGHT_NAMES) == len(start)
    once, examples, stats = recipe.local_update(start, 3, 100, seed=0, server_round=1)
    again, _, _ = recipe.local_update(start, 3, 100, seed=0, server_round=1)
    other_round, _, _ = recipe.local_update(start, 3, 100, seed=0, server_round=2)
    assert all(np.array_equal(a, b) for a, b in zip(once, again))
    assert not all(np.array_equal(a, b) for a, b in zip(once, other_round))  # another batch order
    assert examples == recipe.examples(3, 100) and stats["steps"] == -(-examples // 8)
    before, after = recipe.evaluate(start), recipe.evaluate(once)
    assert 0 <= after["accuracy"] <= 1 and after["loss"] < before["loss"]


def test_a_wrong_task_value_is_refused_by_its_settings():
    from fedsim_tasks.topical_chat.settings import TurnSentimentSettings

    base = {"name": "t", "client": "c", "schema": "s", "data_root": ROOT, "unit": "client", **TASK}
    TurnSentimentSettings(**base)
    for key, value in (
        ("unit", "turn"),
        ("lr", 0.0),
        ("batch_size", 0),
        ("test_splits", ["valid_rare"]),
        ("train_splits", ["train"]),
    ):
        with pytest.raises(ValueError, match=f"task.{key}"):
            TurnSentimentSettings(**{**base, key: value})
