"""Hosted clients' shared work: who computes with whom, and that a client never takes a result
computed for another message than its own."""

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fedsim.runtime import hosted_work
from fedsim.runtime.inprocess_grid import InProcessGrid

InProcessGrid({})  # a run identity: message metadata needs one


def message(weights: ArrayRecord, config: ConfigRecord) -> Message:
    return Message(
        RecordDict({"arrays": weights, "config": config}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )


class Work:
    """A task's work: each partition's result is the partition times the sent weight; records
    every batched call's partitions (``alone``: the sent weight, call recorded as ``None``)."""

    def __init__(self):
        self.calls: list[list[int] | None] = []

    def alone(self, msg: Message) -> float:
        self.calls.append(None)
        return -float(msg.content["arrays"]["w"].numpy()[0])

    def __call__(self, msg: Message, partitions: list[int]) -> list[float]:
        self.calls.append(list(partitions))
        sent = float(msg.content["arrays"]["w"].numpy()[0])
        return [p * sent for p in partitions]


def broadcast(n: int, value: float = 2.0) -> list[Message]:
    weights, config = ArrayRecord({"w": Array(np.array([value]))}), ConfigRecord({"seed": 0})
    return [message(weights, config) for _ in range(n)]


def serve(peers: list[tuple[Message, int]], work: Work, chunk: int = 64) -> list[float]:
    with hosted_work.batch(peers):
        return [hosted_work.result(p, m, work.alone, work, chunk) for m, p in peers]


def test_outside_a_batch_each_client_computes_its_own():
    work = Work()
    got = [hosted_work.result(p, m, work.alone, work) for p, m in enumerate(broadcast(3))]
    assert got == [-2, -2, -2] and work.calls == [None] * 3


def test_peers_with_the_same_records_are_computed_once_in_chunks():
    work = Work()
    peers = list(zip(broadcast(5), [7, 3, 9, 1, 4]))
    assert serve(peers, work) == [14, 6, 18, 2, 8]
    assert work.calls == [[7, 3, 9, 1, 4]]
    work.calls.clear()
    assert serve(peers, work, chunk=2) == [14, 6, 18, 2, 8]
    assert work.calls == [[7, 3], [9, 1], [4]]


def test_a_client_whose_message_differs_computes_with_its_own_peers_only():
    work = Work()
    first, second = broadcast(2, 2.0), broadcast(2, 5.0)
    peers = [(first[0], 0), (second[0], 1), (first[1], 2), (second[1], 3)]
    assert serve(peers, work) == [0, 5, 4, 15]
    assert work.calls == [[0, 2], [1, 3]]


def test_a_message_a_mod_replaced_is_computed_alone_not_taken_from_its_peers_result():
    """Client 1's message reaches its handler with other records (a mod rebuilt it): the result
    computed for its batch message is not its answer."""
    work = Work()
    peers = list(zip(broadcast(3, 2.0), [0, 1, 2]))
    replaced = broadcast(1, 10.0)[0]
    with hosted_work.batch(peers):
        got = [
            hosted_work.result(0, peers[0][0], work.alone, work),
            hosted_work.result(1, replaced, work.alone, work),
            hosted_work.result(2, peers[2][0], work.alone, work),
        ]
    assert got == [0, 10, 4]
    assert work.calls == [[0, 1, 2], [1]]


def test_results_go_with_their_batch():
    work = Work()
    peers = list(zip(broadcast(3), [0, 1, 2]))
    with hosted_work.batch(peers):
        hosted_work.result(0, peers[0][0], work.alone, work)
    assert hosted_work.result(1, peers[1][0], work.alone, work) == -2  # computed again, alone
    assert work.calls == [[0, 1, 2], None]
