"""A seed fixes the result. Under the Ray simulation two things vary from run to run
with one seed: which clients a process (Ray actor) serves before a given message, and the
order in which replies arrive (and Flower's node ids). Both are played here in process, cheaply:

- every experiment's client, through the real ClientApp handler, replies the same to a message
  whether the process served it first or after other clients (torch's global generator
  carried the previous clients' dropout draws into the next one's training);
- the Messenger returns replies in the order it sent the messages, whatever order they arrive
  in, and with the partitions known lists the nodes in partition order, so FedTP's release is
  the same to the bit for any layout of node ids.
"""

import json
import random
from dataclasses import asdict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_e2e_fedbiscuit import SLICE as FEDBISCUIT
from test_e2e_feddtre import SLICE as FEDDTRE

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.config.node_local import from_run
from fedsim.config.schema import check
from fedsim.flower.strategies import strategy_utils
from fedsim.runtime import client_app
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import ANY, Messenger, Policy, client_config
from fedsim.runtime.records import from_record, to_bytes, to_record
from fedsim.runtime.server_app import seed_server
from fedsim.runtime.validators import finite_arrays
from fedsim.trust_mixing import MIXING
from fedsim_clients import feddtre_messages as dtre
from fedsim_clients import fede4rag_messages as rag
from fedsim_clients import fedtp_messages as fedtp
from fedsim_clients import preference_messages as pref
from fedsim_strategies.dp_mean import DPMean
from fedsim_tasks.topical_chat.dataset import load_topics

DATA = data_root_override()


def serve(
    msg: Message, partition: int, num_partitions: int, node: dict | None = None
) -> RecordDict:
    """``msg`` through the real ClientApp (its mods: fault injection, client-side clipping; the
    per-message seeding) as partition ``partition`` of this process, on a node whose config
    gives ``node`` (its folders: ``fedsim.config.node_local.from_run(cfg)``)."""
    context = Context(
        run_id=1,
        node_id=100 + partition,
        state=RecordDict(),
        run_config={},
        node_config={**(node or {}), "partition-id": partition, "num-partitions": num_partitions},
    )
    return client_app.app(msg, context).content


def assert_same_reply(a: RecordDict, b: RecordDict) -> None:
    """Every array equal to the bit; every metric but timings equal."""
    for name, record in a.array_records.items():
        x, y = from_record(record), from_record(b.array_records[name])
        assert list(x) == list(y)
        for key in x:
            assert np.array_equal(x[key], y[key]), (
                f"{name}/{key} differs by {np.abs(x[key] - y[key]).max()}"
            )
    for name, record in a.metric_records.items():
        timeless = lambda r: {k: v for k, v in r.items() if not k.endswith("seconds")}  # noqa: E731
        assert timeless(record) == timeless(b.metric_records[name])


def assert_history_free(
    config: dict, arrays: ArrayRecord, num_partitions: int, node: dict | None = None
) -> None:
    """Partition 0's reply to a train message (every method's keys: ``config``, ``arrays``) is
    the same served first (the process builds everything) and served again after every other
    partition's message in the same process."""

    def train(p: int) -> RecordDict:
        msg = Message(
            RecordDict({"config": ConfigRecord(config), "arrays": arrays}),
            dst_node_id=100 + p,
            message_type=MessageType.TRAIN,
        )
        return serve(msg, p, num_partitions, node)

    first = train(0)
    for p in range(1, num_partitions):
        train(p)
    assert_same_reply(first, train(0))


@pytest.fixture(autouse=True)
def _run_identity():
    InProcessGrid({})  # this process plays a run (message metadata needs a run id)


def test_feddtre_clients_reply_the_same_whatever_the_process_served_before(tmp_path):
    cfg = compose(
        [
            *FEDDTRE,
            DATA,
            "protocol.generator.base_sft_steps=0",
            f"protocol.generator.base_dir={tmp_path / 'gen'}",
            f"client_state.dir={tmp_path / 'state'}",
        ]
    )
    from fedsim_experiments.feddtre.protocol import base_generator
    from fedsim_tasks.causal_lm import load_policy
    from fedsim_tasks.hf import trainable_arrays

    g = check(cfg).generator
    base, _ = base_generator(g, cfg.data_root, 0)
    generator = trainable_arrays(load_policy(base, dict(g.lora), 0))
    evaluator = instantiate(cfg.task.evaluator, seed=0).weights()
    common = {
        **client_config(cfg),
        dtre.SEED: 0,
        dtre.TORCH_THREADS: 1,
        "server-round": 1,
        dtre.BATCH_SIZE: 2,
        dtre.LOCAL_STEPS: 2,
    }
    evaluator_config = {**common, dtre.OBJECTIVE: dtre.EVALUATOR, dtre.LR: 1e-3}
    generator_config = {
        **common,
        dtre.OBJECTIVE: dtre.GENERATOR,
        dtre.DATASET: "cmu_dog",
        dtre.LOCAL_MODEL: "generator-cmu_dog-feddtre",
        dtre.SETTINGS: json.dumps({**asdict(g), "base": str(base), "rounds": 2}),
        dtre.EVALUATOR_WEIGHTS: to_bytes(evaluator),
        MIXING: json.dumps({"k": 0.7, "midpoint": 0.01, "alpha_min": 0.1, "alpha_max": 1.0}),
    }
    assert_history_free(evaluator_config, to_record(evaluator), 2, from_run(cfg))
    assert_history_free(generator_config, to_record(generator), 2, from_run(cfg))


@pytest.mark.parametrize("selector", ["frozen", "lora"])
def test_fedbiscuit_selector_clients_reply_the_same_whatever_the_process_served_before(selector):
    lora = ["task.selector.frozen=false", "task.selector.lora={r: 4, alpha: 8, dropout: 0.05}"]
    cfg = compose(
        [*FEDBISCUIT, DATA, "task.selector.max_length=32", *(lora if selector == "lora" else [])]
    )
    weights = instantiate(cfg.task.selector, seed=0).weights()
    config = {
        **client_config(cfg),
        pref.OBJECTIVE: pref.SELECTOR,
        pref.SEED: 0,
        pref.TORCH_THREADS: 1,
        "server-round": 1,
        pref.LOCAL_STEPS: 2,
        pref.BATCH_SIZE: 4,
        pref.LR: 1e-2,
    }
    assert_history_free(config, to_record(weights), int(cfg.task.partitioner.num_partitions))


def test_fede4rag_clients_reply_the_same_whatever_the_process_served_before(tmp_path):
    cfg = compose(
        [
            "experiment=fede4rag_paper",
            "task.companies=[AES Corporation,Boeing]",
            "task.pages_per_client=8",
            "task.max_seq_length=32",
            f"task.he.key_dir={tmp_path / 'keys'}",
            f"client_state.dir={tmp_path / 'state'}",
        ]
    )
    ask = {**client_config(cfg), rag.QUERY_OP: rag.INITIAL_WEIGHTS}
    initial = serve(
        Message(
            RecordDict({rag.CONFIG: ConfigRecord(ask)}),
            dst_node_id=100,
            message_type=MessageType.QUERY,
        ),
        0,
        2,
        from_run(cfg),
    )[rag.ARRAYS]
    config = {
        **client_config(cfg),
        rag.METHOD: "fede4rag",
        rag.WEIGHTS: rag.FROM_ARRAYS,
        rag.LOCAL_STEPS: 2,
        rag.BATCH_SIZE: 4,
        rag.LR: 1e-3,
        rag.TEMPERATURE: 0.05,
        rag.KD_WEIGHT: 1.0,
        rag.SEED: 0,
        rag.SERVER_ROUND: 1,
        rag.TORCH_THREADS: 1,
    }
    assert_history_free(config, initial, 2, from_run(cfg))


class ShuffledGrid(InProcessGrid):
    """Replies delivered in a random order (as a simulation's actors finish), node ids drawn at
    random per run (as Flower's)."""

    def __init__(self, handlers, rng: random.Random):
        super().__init__(handlers)
        self.rng = rng

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        return self.rng.sample(replies, len(replies))


def fedtp_release(layout_seed: int) -> np.ndarray:
    """One FedTP prior round (DPMean at sigma 0) over 12 clients behind the real ClientApp,
    with node ids and reply order drawn from ``layout_seed``."""
    cfg = compose(["task.max_per_split=3", DATA])
    n, rng = 12, random.Random(layout_seed)
    ids = rng.sample(range(10**6), n)

    def handler(p):
        return lambda msg: serve(msg, p, n)

    grid = ShuffledGrid({ids[p]: handler(p) for p in rng.sample(range(n), n)}, rng)
    messenger = Messenger(grid, 60.0, poll_seconds=0.0, know_partitions=True)
    dim = len(load_topics(cfg.data_root))
    strategy = DPMean(clip_norm=1.0, noise_multiplier=0.0)
    result = strategy.start(
        messenger.grid("prior", Policy(ANY, finite_arrays), messenger.node_ids()),
        initial_arrays=ArrayRecord({fedtp.VECTORS: Array(np.full(dim, 1.0 / dim))}),
        num_rounds=1,
        timeout=60.0,
        train_config=ConfigRecord({**client_config(cfg), fedtp.SPLITS: list(cfg.task.splits)}),
    )
    return result.arrays[fedtp.VECTORS].numpy().reshape(-1)


def test_fedtp_release_is_the_same_to_the_bit_for_any_node_ids_and_reply_order():
    releases = [fedtp_release(seed) for seed in range(4)]
    for other in releases[1:]:
        assert np.array_equal(releases[0], other), np.abs(releases[0] - other).max()


def test_replies_come_back_in_the_order_sent():
    grid = ShuffledGrid(
        {
            n: (lambda msg: RecordDict({"m": ConfigRecord({"i": msg.content["c"]["i"]})}))
            for n in range(1, 9)
        },
        random.Random(0),
    )
    messages = [
        Message(
            RecordDict({"c": ConfigRecord({"i": i})}), dst_node_id=n, message_type=MessageType.QUERY
        )
        for i, n in enumerate([5, 2, 8, 1, 7, 3, 6, 4])
    ]
    replies = Messenger(grid, 10.0, poll_seconds=0.0).exchange("order", messages, Policy(ANY))
    assert [r.content["m"]["i"] for r in replies] == list(range(8))


def test_a_client_config_carries_the_run_seed():
    assert (
        client_config(
            OmegaConf.create(
                {
                    "task": {},
                    "faults": {},
                    "seed": 7,
                    "results_dir": "x",
                    "client_state": {"dir": None, "keep": False},
                }
            )
        )[client_app.SEED_KEY]
        == 7
    )


def test_flower_samples_the_same_nodes_whatever_else_draws_from_random(monkeypatch):
    """Flower's heartbeat thread and back-off draw from ``random`` as often as timing says: the
    nodes a seeded run samples must not depend on it."""
    monkeypatch.setattr(
        strategy_utils, "random", strategy_utils.random
    )  # given back after the test
    grid = InProcessGrid({n: None for n in range(1, 11)})

    def rounds(other_draws: int) -> list[list[int]]:
        seed_server(0)
        out = []
        for _ in range(5):
            for _ in range(other_draws):
                random.random()  # as the heartbeat does
            out.append(strategy_utils.sample_nodes(grid, 2, 2)[0])
        return out

    assert rounds(0) == rounds(3)
