"""turn_sentiment_fedavg's task (the workload of bench/simulation_peers.py) on the real
Topical-Chat turns."""

import numpy as np
import pytest

from fedsim.config.data import resolve_data_root
from fedsim_tasks.test_causal_lm import one_thread  # noqa: F401 (fixture: one torch thread)
from fedsim_tasks.topical_chat.dataset import SENTIMENTS
from fedsim_tasks.topical_chat.turn_sentiment import (
    WEIGHT_NAMES,
    Recipe,
    classes_of,
    client_rows,
    count_turns,
    load_turns,
)

ROOT = str(resolve_data_root())
TASK = {
    "train_splits": ["valid_rare"],
    "test_splits": ["test_rare"],
    "features": 64,
    "hidden": 8,
    "classes": {
        "curious": ["Curious to dive deeper"],
        "neutral": ["Neutral"],
        "emotional": ["Surprised", "Happy", "Sad", "Disgusted", "Angry", "Fearful"],
    },
    "batch_size": 8,
    "lr": 0.5,
}
CLASSES = classes_of(TASK["classes"])


def test_labels_are_the_classes_of_the_annotated_sentiments_and_features_are_stateless():
    turns = load_turns(ROOT, ("valid_rare",), 64, CLASSES)
    assert len(turns) == len(turns.x) > 10_000
    assert np.allclose(np.linalg.norm(turns.x[:100], axis=1), 1.0, atol=1e-5)
    both = load_turns(ROOT, ("valid_rare", "test_rare"), 64, CLASSES)
    assert np.array_equal(
        both.x[: len(turns)], turns.x
    )  # a turn's features do not depend on the others'
    each = classes_of({s: [s] for s in SENTIMENTS})  # one class per sentiment: the 8-way label
    annotated = load_turns(ROOT, ("valid_rare",), 64, each).y
    grouped = np.array([0, 1, 2, 2, 2, 2, 2, 2])[annotated]  # curious, neutral, the 6 emotions
    assert np.array_equal(turns.y, grouped) and set(np.unique(annotated)) == set(range(8))


def test_the_counted_turns_are_the_loaded_ones_and_give_each_client_its_rows():
    splits = ("valid_rare", "test_rare")
    assert count_turns(ROOT, splits) == len(load_turns(ROOT, splits, 64, CLASSES))
    recipe = Recipe.of({**TASK, "train_splits": list(splits)}, ROOT)
    assert [recipe.examples(c, 700) for c in (0, 350, 699)] == [
        len(client_rows(len(recipe.train_turns()), 700, c)) for c in (0, 350, 699)
    ]


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
    assert [w.shape for w in start] == [(8, 64), (8,), (3, 8), (3,)]
    assert len(WEIGHT_NAMES) == len(start)
    once, examples, stats = recipe.local_update(start, 3, 100, seed=0, server_round=1)
    again, _, _ = recipe.local_update(start, 3, 100, seed=0, server_round=1)
    other_round, _, _ = recipe.local_update(start, 3, 100, seed=0, server_round=2)
    assert all(np.array_equal(a, b) for a, b in zip(once, again))
    assert not all(np.array_equal(a, b) for a, b in zip(once, other_round))  # another batch order
    assert examples == recipe.examples(3, 100) and stats["steps"] == -(-examples // 8)
    before, after = recipe.evaluate(start), recipe.evaluate(once)
    assert 0 <= after["accuracy"] <= 1 and after["loss"] < before["loss"]


def test_fedavg_of_the_local_updates_learns_above_the_majority_class_in_a_few_rounds():
    """FedAvg (the mean weighted by examples, as Flower's) of 8 clients' local epochs over the
    real valid_rare turns, scored on test_rare: above the majority class's accuracy, and above
    the 1/3 balanced accuracy and the macro-F1 any one-class predictor gets, from round 1."""
    recipe = Recipe.of({**TASK, "features": 256, "hidden": 16}, ROOT)
    labels = recipe.test_turns().y
    majority = np.bincount(labels).max() / len(labels)
    one_class_f1 = 2 * majority / (1 + majority) / 3  # macro-F1 of always the majority class
    weights, curve = recipe.initial(seed=0), []
    for server_round in (1, 2, 3):
        updates = [recipe.local_update(weights, c, 8, 0, server_round) for c in range(8)]
        examples = sum(n for _, n, _ in updates)
        weights = [sum(w[i] * n for w, n, _ in updates) / examples for i in range(len(weights))]
        curve.append(recipe.evaluate(weights))
    for scores in curve:
        assert scores["accuracy"] > majority + 0.03, (majority, curve)
        assert scores["balanced_accuracy"] > 1 / 3 + 0.03, curve
        assert scores["macro_f1"] > one_class_f1 + 0.1, (one_class_f1, curve)
    assert curve[-1]["accuracy"] > majority + 0.05 and curve[-1]["loss"] < curve[0]["loss"], curve


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
        ("classes", {"curious": ["Curious to dive deeper"], "rest": ["Neutral"]}),
        ("classes", {"all": list(SENTIMENTS)}),
        ("classes", {"a": list(SENTIMENTS), "b": ["Neutral"]}),
    ):
        with pytest.raises(ValueError, match=f"task.{key}"):
            TurnSentimentSettings(**{**base, key: value})


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_batched_epochs_equal_the_per_client_loop_to_float_order(one_thread, mu):  # noqa: F811
    recipe = Recipe.of(TASK, ROOT)
    num_clients = 1500  # 7-8 turns a client: one step of 8 for some, 7 for others
    clients = [0, 1, 2, 700, 1499]
    weights = recipe.initial(3)
    stacked, examples, losses = recipe.local_updates(weights, clients, num_clients, 3, 2, mu)
    wide = Recipe.of({**TASK, "batch_size": 3}, ROOT)  # 3 steps, the last one short
    wide_stacked, wide_examples, wide_losses = wide.local_updates(
        weights, clients, num_clients, 3, 2, mu
    )
    for recipe_, got, counts, means in (
        (recipe, stacked, examples, losses),
        (wide, wide_stacked, wide_examples, wide_losses),
    ):
        for i, client in enumerate(clients):
            alone, n, metrics = recipe_.local_update(weights, client, num_clients, 3, 2, mu)
            assert counts[i] == n
            assert means[i] == pytest.approx(metrics["loss"], rel=1e-5)
            for tensor, one in zip(got, alone):
                assert np.allclose(tensor[i], one, rtol=1e-5, atol=1e-6)
    assert not np.allclose(stacked[0][0], weights[0])  # they trained


def test_a_clients_batched_epoch_is_the_same_to_the_bit_whoever_shares_it(one_thread):  # noqa: F811
    """The batched backend's reply must not depend on which SuperNode served a client or who
    shared its computation (a resumed run serves clients elsewhere): every step runs over
    ``batch_size`` rows a client, whatever its peers hold."""
    recipe = Recipe.of(TASK, ROOT)
    num_clients = 10_000  # 3-4 turns a client: one step, shorter than a batch
    weights = recipe.initial(3)
    pool = [5, 17, 80, 120, 199, 3, 44, 9_999]
    counts = {recipe.examples(c, num_clients) for c in pool}
    assert len(counts) > 1  # peers holding more rows than client 5 widen a step's batch

    def of_client_5(clients):
        stacked, _, losses = recipe.local_updates(weights, clients, num_clients, 3, 2, 0.5)
        i = clients.index(5)
        return [t[i] for t in stacked], losses[i]

    alone, loss = of_client_5([5])
    for clients in ([5, 17], pool, pool[::-1], [9_999, 5]):
        got, got_loss = of_client_5(clients)
        assert got_loss == loss
        for tensor, one in zip(got, alone):
            assert np.array_equal(tensor, one)
