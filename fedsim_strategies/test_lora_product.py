"""LoRA aggregation by the adapters' product: the mean of the clients' ``B @ A`` where its rank
allows, which averaging the factors apart is not; through Flower's FedAvg as the run uses it."""

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.runtime.records import from_record, to_record
from fedsim_strategies.lora_product import LoraProductAvg, product_average

A, B, BASE = (
    "layer.query.lora_A.default.weight",
    "layer.query.lora_B.default.weight",
    "layer.norm.weight",
)
RANK, OUT, IN = 4, 6, 5


def _client(rng, used: int) -> dict[str, np.ndarray]:
    """Rank-4 adapters whose product has rank ``used`` (the other columns of B zero)."""
    b = rng.normal(size=(OUT, RANK)).astype(np.float32)
    b[:, used:] = 0.0
    return {
        A: rng.normal(size=(RANK, IN)).astype(np.float32),
        B: b,
        BASE: rng.normal(size=IN).astype(np.float32),
    }


def _mean_product(clients, weights):
    w = np.asarray(weights) / sum(weights)
    return sum(wi * (c[B].astype(np.float64) @ c[A]) for wi, c in zip(w, clients))


def test_product_average_is_the_mean_of_the_products_where_rank_allows_and_factor_averaging_is_not():
    rng = np.random.default_rng(0)
    clients, weights = (
        [_client(rng, 2), _client(rng, 2)],
        [3.0, 1.0],
    )  # mean of two rank-2 products: rank <= 4
    merged = product_average(clients, weights)
    assert (
        set(merged) == {A, B} and merged[A].shape == (RANK, IN) and merged[B].shape == (OUT, RANK)
    )
    np.testing.assert_allclose(merged[B] @ merged[A], _mean_product(clients, weights), atol=1e-5)
    w = np.asarray(weights) / sum(weights)
    factors = sum(wi * c[B] for wi, c in zip(w, clients)) @ sum(
        wi * c[A] for wi, c in zip(w, clients)
    )
    assert np.abs(factors - _mean_product(clients, weights)).max() > 0.1


def test_beyond_the_rank_it_is_the_best_rank_r_approximation():
    rng = np.random.default_rng(1)
    clients = [_client(rng, RANK) for _ in range(3)]  # mean of three rank-4 products: rank 5 > 4
    exact = _mean_product(clients, [1.0, 1.0, 1.0])
    merged = product_average(clients, [1.0, 1.0, 1.0])
    s = np.linalg.svd(exact, compute_uv=False)
    assert s[RANK] > 0.1  # the mean has rank 5: no rank-4 pair holds it
    np.testing.assert_allclose(
        np.linalg.norm(merged[B] @ merged[A] - exact), np.sqrt((s[RANK:] ** 2).sum()), rtol=1e-4
    )


def _reply(arrays: dict, pairs: float) -> Message:
    content = RecordDict(
        {"arrays": to_record(arrays), "metrics": MetricRecord({"num-examples": pairs})}
    )
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def test_the_wrapper_replaces_the_adapters_and_keeps_fedavgs_other_arrays():
    rng = np.random.default_rng(2)
    clients, weights = [_client(rng, 2), _client(rng, 2)], [3.0, 1.0]
    replies = [_reply(c, n) for c, n in zip(clients, weights)]
    plain, _ = FedAvg().aggregate_train(1, [_reply(c, n) for c, n in zip(clients, weights)])
    arrays, _ = LoraProductAvg(FedAvg()).aggregate_train(1, replies)
    out, fedavg = from_record(arrays), from_record(plain)
    assert list(out) == list(fedavg)
    np.testing.assert_array_equal(out[BASE], fedavg[BASE])
    np.testing.assert_allclose(out[B] @ out[A], _mean_product(clients, weights), atol=1e-5)
    assert np.abs(fedavg[B] @ fedavg[A] - _mean_product(clients, weights)).max() > 0.1
    assert isinstance(arrays, ArrayRecord)
