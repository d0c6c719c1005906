"""HE is a layer around any handler that exchanges weights, not the retriever's own code: the
FedBiscuit selector's handler, served through the real ClientApp with the retriever's CKKS
parameters in its task, trains under HEFedAvg from plain weights only: round 1 from the common
initial weights, round 2 from round 1's aggregate, which the train message carried encrypted and
which decrypts to plain FedAvg's average; and the last aggregate every client holds decrypts to
the average of what they trained (within CKKS's error)."""

from functools import partial

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp.strategy import FedAvg
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_determinism import serve
from test_strategy_matrix import CLIENTS, WEIGHT_SLICES

from conftest import data_root_override
from fedsim.config import node_local
from fedsim.config.compose import CONF_DIR, compose
from fedsim.message_keys import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, SERVER_ROUND
from fedsim.privacy.he.ckks import CKKSParams
from fedsim.privacy.he.client import HEClient
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime import client_state
from fedsim.runtime.he_layer import unflatten
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.records import from_record, to_record
from fedsim_clients.preference import PreferenceClient
from fedsim_experiments.fedbiscuit import protocol as fedbiscuit
from fedsim_strategies.he_fedavg import HEFedAvg
from fedsim_tasks.test_causal_lm import encoder_dir  # noqa: F401 (fixture: the tiny BERT selector)

DATA = data_root_override()

ROUNDS = 2


@pytest.fixture(scope="module")
def selectors(encoder_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """Five FedBiscuit clients of the tiny selector, their task carrying the retriever's CKKS
    block (its key folder this test's), discovered through the real ClientApp."""
    tmp = tmp_path_factory.mktemp("he-layer")
    cfg = compose(
        [
            "experiment=fedbiscuit_paper",
            DATA,
            f"num_rounds={ROUNDS}",
            f"client_state.dir={tmp / 'state'}",
            *WEIGHT_SLICES["fedbiscuit_paper"](encoder_dir, tmp),
        ]
    )
    OmegaConf.set_struct(cfg, False)
    cfg.task.he = {
        **OmegaConf.load(CONF_DIR / "task" / "financebench_rag.yaml").he,
        "key_dir": str(tmp / "keys"),
    }
    node = node_local.from_run(cfg)
    grid = InProcessGrid(
        {
            100 + p: partial(serve, partition=p, num_partitions=CLIENTS, node=node)
            for p in range(CLIENTS)
        }
    )
    return fedbiscuit.context(
        Messenger(grid, timeout=60),
        cfg,
        instantiate(cfg.task.selector, seed=cfg.task.seed),
        PrivacyPlan.fresh(cfg),
    )


def _aggregate(ctx, partition: int) -> np.ndarray:
    """The complete HE aggregate of the last round that client ``partition`` holds on its disk."""
    msg = Message(
        RecordDict({CONFIG: ConfigRecord(ctx.base)}),
        dst_node_id=100 + partition,
        message_type=MessageType.QUERY,
    )
    node_local.attach(msg, node_local.from_run(ctx.cfg))
    he = ctx.cfg.task.he
    params = CKKSParams(he.poly_modulus_degree, tuple(he.coeff_mod_bit_sizes), he.global_scale_bits)
    return HEClient(params, he.key_dir, client_state.of(msg, partition).folder).global_weights(
        ROUNDS
    )


def _trainings(monkeypatch) -> list[dict]:
    """Each selector training the clients run from now on: its round, partition, the weights the
    handler was given and those it trained, and its weight (what the ClientApp's HE layer hides)."""
    seen, train = [], PreferenceClient.train

    def spy(self, msg):
        reply = train(self, msg)
        seen.append(
            {
                "round": int(msg.content[CONFIG][SERVER_ROUND]),
                "partition": self.partition_id,
                "given": from_record(msg.content[ARRAYS]),
                "trained": from_record(reply[ARRAYS]),
                "weight": float(reply[METRICS][NUM_EXAMPLES]),
            }
        )
        return reply

    monkeypatch.setattr(PreferenceClient, "train", spy)
    return seen


def _mean(trainings: list[dict]) -> dict[str, np.ndarray]:
    total = sum(t["weight"] for t in trainings)
    return {
        k: sum(t["weight"] / total * t["trained"][k].astype(np.float64) for t in trainings)
        for k in trainings[0]["trained"]
    }


def _close(got: dict, expected: dict, what: str) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, atol=1e-5, err_msg=f"{what}: {key}")


def test_he_wraps_the_selector_and_decrypts_to_the_plain_average(selectors, monkeypatch):
    ctx, config = selectors, ConfigRecord(selectors.train_config())
    initial = to_record(ctx.initial)
    seen = _trainings(monkeypatch)
    FedAvg(fraction_evaluate=0.0).start(
        ctx.grid("plain", Policy(ANY, ctx.train_reply(initial))), initial, ROUNDS, 60, config
    )
    plain = list(seen)
    strategy = HEFedAvg(FedAvg(fraction_evaluate=0.0), chunk_floats=2**22)
    assert not len(
        strategy.start(ctx.grid("he"), ArrayRecord(), ROUNDS, 60, config).arrays
    )  # no model on the server
    he = seen[len(plain) :]
    assert [strategy.rounds[r]["one-trip"] for r in (1, 2)] == [1, 1]
    assert len(plain) == len(he) == ROUNDS * CLIENTS
    for t in (
        t for t in he if t["round"] == 1
    ):  # the layer's round 0: the clients' common initial weights
        _close(t["given"], ctx.initial, f"client {t['partition']}, round 1")
        _close(
            t["trained"],
            next(p for p in plain if p["round"] == 1 and p["partition"] == t["partition"])[
                "trained"
            ],
            f"client {t['partition']} trained",
        )
    first = _mean([p for p in plain if p["round"] == 1])  # plain FedAvg's round-1 model
    assert any(
        not np.allclose(first[k], ctx.initial[k]) for k in first
    )  # the round moved the selector
    for t in (t for t in he if t["round"] == 2):  # decrypted from what the train message carried
        _close(t["given"], first, f"client {t['partition']}, round 2")
    last = _mean(
        [t for t in he if t["round"] == 2]
    )  # what the HE clients trained in round 2, averaged
    for partition in range(CLIENTS):
        _close(
            unflatten(_aggregate(ctx, partition), ctx.initial),
            last,
            f"client {partition}'s aggregate",
        )
