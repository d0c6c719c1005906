"""A FedE4RAG node never evaluates or trains other weights than the ones the message names:
no HE copy, an incomplete HE copy (through the HE layer that wraps the retriever), missing or empty
arrays are errors naming the node (and the method); the key of the weights evaluated is the key of
the weights sent."""

import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.config.node_local import environment, sent_task
from fedsim.privacy.he import ckks
from fedsim.privacy.he import messages as he_keys
from fedsim.privacy.he.client import IncompleteGlobal
from fedsim.runtime.he_layer import HELayer, around, flatten
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_clients import fede4rag_messages as keys
from fedsim_clients.retriever import MissingWeights, RetrieverClient
from fedsim_tasks.financebench_rag.retrieval import weights_key


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """Node 0 of 2, its folders (key, cache, state) in this process's environment, as
    ``fedsim run`` gives a simulation's clients theirs (``fedsim/config/node_local.py``)."""
    tmp = tmp_path_factory.mktemp("retriever")
    cfg = compose(
        [
            "experiment=fede4rag_paper",
            "task.companies=[AES Corporation,Boeing]",
            "task.pages_per_client=5",
            "task.n_valid=2",
            "task.n_test=2",
            "task.corpus_pages_per_doc=2",
            f"task.embedding_cache={tmp / 'cache'}",
            f"task.he.key_dir={tmp / 'keys'}",
            f"client_state.dir={tmp / 'state'}",
        ]
    )
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment(cfg, {}).items():
            patch.setenv(name, value)
        yield RetrieverClient(
            sent_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.data_root, 0, 2
        )


def _message(config: dict, message_type=MessageType.EVALUATE, **records) -> Message:
    content = RecordDict({keys.CONFIG: ConfigRecord({keys.METHOD: "fede4rag", **config})})
    for name, record in records.items():
        content[name] = record
    return Message(content, dst_node_id=1, message_type=message_type)


def _evaluate(weights: str, **extra) -> dict:
    return {
        keys.WEIGHTS: weights,
        keys.EVAL_OP: keys.ENCODE,
        keys.PIECE: 0,
        keys.PAGES_PER_MESSAGE: 1000,
        keys.EVAL_BACKEND: "torch",
        keys.SPLITS: ["test"],
        **extra,
    }


def test_arrays_missing_or_empty_is_an_error(client):
    with pytest.raises(MissingWeights, match="fede4rag: node 0 .*carries no arrays"):
        client.evaluate(_message(_evaluate(keys.FROM_ARRAYS)))
    with pytest.raises(MissingWeights, match="carries no arrays"):
        client.evaluate(_message(_evaluate(keys.FROM_ARRAYS), arrays=ArrayRecord()))
    train = {
        keys.WEIGHTS: keys.FROM_ARRAYS,
        keys.LOCAL_STEPS: 1,
        keys.BATCH_SIZE: 2,
        keys.LR: 1e-4,
        keys.TEMPERATURE: 0.05,
        keys.KD_WEIGHT: 0.0,
        keys.SEED: 0,
    }
    with pytest.raises(MissingWeights, match="carries no arrays"):
        client.train(_message(train, MessageType.TRAIN, arrays=ArrayRecord()))


def test_unknown_weight_source_is_an_error(client):
    with pytest.raises(MissingWeights, match="is not one of"):
        client.evaluate(_message(_evaluate("latest")))


@pytest.fixture(scope="module")
def layer(client) -> HELayer:
    """The retriever as the ClientApp serves it: the task carries CKKS parameters."""
    return around(client, client.task)


def test_no_he_copy_is_an_error(layer):
    with pytest.raises(IncompleteGlobal, match="node 0 .*no complete HE aggregate of round 3"):
        layer.handle(_message(_evaluate(keys.FROM_HE, **{he_keys.GLOBAL_ROUND: 3})))


def test_incomplete_he_copy_is_an_error(client, layer):
    he = layer.he(_message({}))
    flat = flatten(client.initial)
    size = 4096
    blobs = ckks.encrypt(he.ctx, flat[:size], he.params.slots)  # chunk 0 of 2 only
    he.handle(
        _message(
            {
                he_keys.OP: he_keys.INSTALL,
                he_keys.SERVER_ROUND: 1,
                he_keys.CHUNK: 0,
                he_keys.CHUNK_FLOATS: size,
                he_keys.NUM_CHUNKS: 2,
                he_keys.NUM_FLOATS: flat.size,
                he_keys.KEY_ID: ckks.key_id(ckks.public_bytes(he.ctx)),
            },
            MessageType.QUERY,
            **{he_keys.CIPHERTEXTS: ckks.blobs_record(blobs)},
        )
    )
    with pytest.raises(IncompleteGlobal, match=r"node 0 .*round 1 .*'installed': \[0\]"):
        layer.handle(_message(_evaluate(keys.FROM_HE, **{he_keys.GLOBAL_ROUND: 1})))


def test_evaluated_key_is_the_key_of_the_weights_sent(client):
    rng = np.random.default_rng(0)
    sent = {
        k: (v + rng.normal(scale=1e-3, size=v.shape)).astype(v.dtype)
        for k, v in client.initial.items()
    }
    reply = client.evaluate(
        _message(
            _evaluate(keys.FROM_ARRAYS), arrays=ArrayRecord({k: Array(v) for k, v in sent.items()})
        )
    )
    evaluated = reply[keys.WEIGHTS_INFO][keys.WEIGHTS_KEY]
    assert evaluated == weights_key(client.task["model"], client.task["lora"], sent)
    assert evaluated != weights_key(client.task["model"], client.task["lora"], None)


def test_the_server_does_not_choose_the_key_folder_or_the_cache(client, tmp_path, monkeypatch):
    """The attack: a server's task names the CKKS key folder and the embedding cache (a folder
    where it can read the federation's secret key, or plant one it knows; a cache it fills). The
    node's own folders are used: nothing is created where the task says."""
    key_victim, cache_victim = tmp_path / "server-keys", tmp_path / "server-cache"
    monkeypatch.setattr(
        client,
        "task",
        {
            **client.task,
            "embedding_cache": str(cache_victim),
            "he": {**client.task["he"], "key_dir": str(key_victim)},
        },
    )
    he = around(client, client.task).he(_message({}))
    assert he.ctx.is_private() and Path(he.key_dir) == Path(os.environ["FEDSIM_HE_KEY_DIR"])
    client.evaluate(_message(_evaluate(keys.FROM_INITIAL)))
    assert not key_victim.exists() and not cache_victim.exists()
    assert any(Path(os.environ["FEDSIM_EMBEDDING_CACHE"]).iterdir())  # the node's own cache
