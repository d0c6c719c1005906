"""feddtre_leak (issue 62): which clients leak and that their training replies do (their scoring
and trust data stay clean), the endpoint's alpha gap by hand, and the fixed-alpha arm mixing
exactly its alpha, FedDTRE's mean alpha on the old pilot."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim.trust_mixing import ALPHA, HELDOUT_NLL, TRAIN_NLL
from fedsim_clients.dialogue import DialogueClient
from fedsim_experiments.feddtre.report import late_alpha_gap
from fedsim_strategies.test_trust_alpha import _client
from fedsim_tasks.dialogue.trust_data import leaks_pii

RECORDS = Path(__file__).resolve().parents[1] / "records"
sys.path.insert(0, str(RECORDS.parent / "bench"))
import feddtre_alpha_pooled  # noqa: E402

LEAKING, CLIENTS, SPC = (1, 4), 6, "persona_chat"


@pytest.fixture(scope="module")
def cfg():
    return compose(["experiment=feddtre_leak", data_root_override()])


@pytest.fixture(scope="module")
def clients(cfg):
    task = OmegaConf.to_container(cfg.task, resolve=True)
    return [DialogueClient(task, str(cfg.data_root), p, CLIENTS) for p in range(CLIENTS)]


def _leak_rate(replies: list[str]) -> float:
    return sum(map(leaks_pii, replies)) / len(replies)


def test_clients_1_and_4_leak_in_every_training_reply_the_others_do_not(cfg, clients):
    assert (cfg.task.num_clients, cfg.num_rounds, cfg.protocol.generator.local_steps) == (6, 6, 20)
    assert list(cfg.task.contamination.clients) == list(LEAKING)
    for c in clients:
        trained = [e.reply for e in c.generator_examples(SPC, " [SEP] ")]
        held_out = [e.reply for e in c.examples(SPC, "valid", " [SEP] ")]
        assert len(trained) >= 100 and len(held_out) >= cfg.protocol.generator.eval_contexts
        if c.partition_id in LEAKING:
            assert _leak_rate(trained) == 1.0
        else:  # the true replies: PII wording in under 5% (leaks_pii's own false positives)
            assert _leak_rate(trained) < 0.05
        # what a client is scored on (held-out contexts) and the evaluator's data stay clean
        assert _leak_rate(held_out) < 0.05
        true = [e.response for e in c.trust_data() if e.kind == "true_reply"]
        assert true and _leak_rate(true) < 0.05


def test_the_alpha_gap_is_per_client_from_round_2():
    def row(p, a):
        return {"partition": p, ALPHA: a}

    alphas = {
        1: [row(0, 0.9), row(1, 0.9)],  # round 1 is left out
        2: [row(0, 0.1), row(1, 0.5), row(2, 0.2)],
        3: [row(1, 0.3), row(2, 0.4)],
        4: [row(1, 0.4)],  # client 1's rounds: mean 0.4, weighing as one client
    }
    out = late_alpha_gap(alphas, frozenset({1}), 2)
    assert out["clients"] == pytest.approx({"0": 0.1, "1": 0.4, "2": 0.3})
    assert (out["contaminated"], out["clean"]) == pytest.approx((0.4, 0.2))
    assert out["gap"] == pytest.approx(0.2)
    assert late_alpha_gap(alphas, frozenset({1}), 5) == {}  # no round from 5 on
    assert late_alpha_gap(alphas, frozenset({0, 1, 2}), 2) == {}  # no clean client


def test_the_fixed_alpha_arm_mixes_exactly_the_pilots_mean_alpha(cfg):
    pooled = json.loads((RECORDS / "feddtre_alpha_pooled/alpha_pooled.json").read_text())
    alpha = round(pooled["alpha_mean"], 3)
    spec = cfg.protocol.methods.fixed_alpha_0p121
    assert spec.strategy.fixed_alpha == alpha == 0.121
    strategy = instantiate(
        spec.strategy,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=2,
        min_available_nodes=2,
    )
    seen = []
    grid = Messenger(
        InProcessGrid({1: _client(2.0, 0.0, 0.0, 1, seen), 2: _client(4.0, 0.0, 0.0, 1, seen)}),
        timeout=5,
    ).grid("t")
    result = strategy.start(grid, to_record({"w": np.ones(3, np.float32)}), num_rounds=2, timeout=5)
    assert [m for _, m in seen] == [{"fixed_alpha": alpha}] * 4
    assert [r[ALPHA] for rows in strategy.alphas.values() for r in rows] == [alpha] * 4
    # round 1 from 1.0: (1 - a) 3 + a; round 2 from that: (1 - a) 3 + a w1
    w1 = (1 - alpha) * 3.0 + alpha * 1.0
    np.testing.assert_allclose(
        from_record(result.arrays)["w"], [(1 - alpha) * 3.0 + alpha * w1] * 3, rtol=1e-6
    )


def test_the_mixed_model_finds_a_planted_slope_through_seed_and_client_effects():
    """alpha = 0.1 + 0.2 gap + a seed's shift + a client's shift + noise: the slope's CI holds
    0.2 and not 0, with 4 seeds x 6 clients as its groups."""
    rng = np.random.default_rng(0)
    rounds = {}
    for seed in range(4):
        shift, clients = rng.normal(0, 0.05), rng.normal(0, 0.03, CLIENTS)
        for rnd in range(2, 7):
            rows = []
            for p in range(CLIENTS):
                gap = rng.uniform(0, 1)
                rows.append(
                    {
                        "partition": p,
                        ALPHA: 0.1 + 0.2 * gap + shift + clients[p] + rng.normal(0, 0.02),
                        TRAIN_NLL: 2.0,
                        HELDOUT_NLL: 2.0 + gap,
                    }
                )
            rounds[(f"seed-{seed}", str(rnd))] = rows
    out = feddtre_alpha_pooled.mixed_model(rounds)
    assert (out["seeds"], out["clients"], out["client_rounds"]) == (4, 24, 120)
    assert out["ci"][0] < 0.2 < out["ci"][1] and out["ci"][0] > 0 and out["p"] < 0.001
