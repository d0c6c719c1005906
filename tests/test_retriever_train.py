"""A FedE4RAG node serves many train messages with one client object (a Ray actor keeps it):
the model and the pairs are built once, and each message trains from the weights it names (the
KD-GLE teacher too), exactly as a fresh client would. The trainer's gc pass on entry sees only
what the call creates, and nothing stays frozen after it (bench/local_training.py)."""

import gc

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.records import from_record, to_record
from fedsim_clients import fede4rag_messages as keys
from fedsim_clients.retriever import RetrieverClient, _encoder
from fedsim_tasks.financebench_rag.dataset import (
    load_pages,
    load_questions,
    page_id,
    question_texts,
    title,
)
from fedsim_tasks.financebench_rag.pseudo_queries import normalized


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retriever-train")
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    return compose(
        [
            "experiment=fede4rag_paper",
            "task.companies=[AES Corporation,Boeing]",
            "task.pages_per_client=8",
            "task.max_seq_length=32",
            f"task.he.key_dir={tmp / 'keys'}",
            f"client_state.dir={tmp / 'state'}",
        ]
    )


def _client(cfg, partition: int = 0) -> RetrieverClient:
    return RetrieverClient(
        OmegaConf.to_container(cfg.task, resolve=True), cfg.data_root, partition, 2
    )


def _train(client: RetrieverClient, weights: dict, server_round: int) -> tuple[dict, dict]:
    config = {
        keys.METHOD: "fede4rag",
        keys.WEIGHTS: keys.FROM_ARRAYS,
        keys.LOCAL_STEPS: 2,
        keys.BATCH_SIZE: 4,
        keys.LR: 1e-3,
        keys.TEMPERATURE: 0.05,
        keys.KD_WEIGHT: 1.0,
        keys.SEED: 0,
        keys.SERVER_ROUND: server_round,
        keys.TORCH_THREADS: 1,
    }
    msg = Message(
        RecordDict({keys.CONFIG: ConfigRecord(config), keys.ARRAYS: to_record(weights)}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    reply = client.train(msg)
    return from_record(reply[keys.ARRAYS]), dict(reply[keys.METRICS])


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-7, err_msg=name)


def test_messages_on_one_client_train_as_fresh_clients(cfg, monkeypatch):
    seen = []  # at each gc.collect(): (objects frozen, objects it scans)
    collect = gc.collect
    monkeypatch.setattr(
        gc,
        "collect",
        lambda *a: seen.append((gc.get_freeze_count(), len(gc.get_objects()))) or collect(*a),
    )
    node = _client(cfg)
    model, pairs = node.model, node.pairs
    rng = np.random.default_rng(0)
    other = {
        k: (v + rng.normal(scale=0.05, size=v.shape)).astype(v.dtype)
        for k, v in node.initial.items()
    }

    first, m1 = _train(node, node.initial, 1)
    second, m2 = _train(node, other, 2)  # other weights, other round
    again, m3 = _train(node, node.initial, 1)  # back to the first message's input
    assert node.model is model and node.pairs is pairs  # not rebuilt, not re-derived
    assert m2["steps"] == 2 and m2["kd"] > 0 and m2["num-examples"] == len(pairs)
    _same(again, first)  # nothing of message 1 or 2 (teacher, optimizer, weights) leaks
    assert (m3["loss"], m3["kd"]) == (m1["loss"], m1["kd"])
    fresh, f2 = _train(_client(cfg), other, 2)
    _same(second, fresh)
    assert (m2["loss"], m2["kd"]) == (f2["loss"], f2["kd"])
    assert not np.allclose(first[next(iter(first))], second[next(iter(second))])

    trainer_passes = [s for s in seen if s[0]]  # the trainer's collect inside train_encoder
    assert len(trainer_passes) == 4  # one per message
    assert all(frozen > 10 * scanned for frozen, scanned in trainer_passes), trainer_passes
    assert gc.get_freeze_count() == 0


def test_the_clients_of_a_process_share_one_encoder_and_train_as_on_their_own(cfg):
    """A SuperNode hosting many companies holds one encoder (``retriever._encoder``): each
    client trains from the weights its message names, whatever the client before it left in
    the shared model, and ends where it ends on an encoder of its own."""
    first, second = _client(cfg, 0), _client(cfg, 1)
    assert first.model is second.model and first.initial is second.initial
    rng = np.random.default_rng(1)
    other = {
        k: (v + rng.normal(scale=0.05, size=v.shape)).astype(v.dtype)
        for k, v in first.initial.items()
    }
    _train(first, other, 2)  # the shared model now holds what the first client trained
    shared, metrics = _train(second, second.initial, 1)
    _encoder.cache_clear()
    alone = _client(cfg, 1)
    assert alone.model is not first.model
    own, own_metrics = _train(alone, alone.initial, 1)
    _same(shared, own)
    assert (metrics["loss"], metrics["kd"]) == (own_metrics["loss"], own_metrics["kd"])


def test_a_nodes_line_item_pairs_hold_no_evaluation_question_over_its_pages(cfg):
    """Boeing's node with ``line_item_questions``: every query is a template question on one
    of its statement lines, every positive one of its pages as the corpus holds it (titled);
    its pages include its evaluation questions' evidence pages, yet no query, nor any
    (query, page) pair, is one of the 150 questions'."""
    task = OmegaConf.to_container(cfg.task, resolve=True)
    task["pages_per_client"] = None
    task["pseudo_queries"]["construction"] = "line_item_questions"
    client = RetrieverClient(task, cfg.data_root, 1, 2)
    assert client.documents and all(d.startswith("BOEING_") for d in client.documents)
    page_of = {
        f"{title(cfg.data_root, doc)}\n{text}": page_id(doc, i)
        for doc in client.documents
        for i, text in enumerate(load_pages(cfg.data_root, doc))
    }
    pairs = [
        (normalized(query.partition(": ")[2]), page_of[positive])
        for query, positive in client.pairs
    ]
    assert len(pairs) > 1000 and all(q.startswith("what was boeing's ") for q, _ in pairs)
    questions = [q for q in load_questions(cfg.data_root) if q.company == "Boeing"]
    evidence = {page for q in questions for page in q.evidence}
    assert evidence & {page for _, page in pairs}  # the evidence pages do train
    asked = {
        (normalized(q.text), page) for q in load_questions(cfg.data_root) for page in q.evidence
    }
    assert not {q for q, _ in pairs} & question_texts(cfg.data_root) and not set(pairs) & asked
