"""FedDTRE's personalized evaluation and the contamination check, played in process: the
protocol's ServerApp code (``fedsim.runtime.server_app``) with the real ClientApp handler behind an
InProcessGrid, no Ray (a Ray start alone costs more than these clients' work). Real data (a
small slice of Synthetic-Persona-Chat), real models built here (base SFT, trust evaluator,
adapters); one client's generator training replies all carry planted PII.

What holds at this size, and is asserted (measured on this slice: PII rate of the personalized
replies 0.2 against 0.0 and 0.0 on 10 contexts; mean s_l 0.22 against 0.30; mean alpha
0.170 against 0.110; with the seeding before ``fedsim/seeding.py``'s streams, 0.6, 0.23 against
0.35, 0.106 against 0.100): the contaminated client's own model learns the leaking wording, the
trust evaluator scores its local replies lower than the clean clients', and FedDTRE gives it
the larger alpha. The margins are small here: with a 40-step base the global model's
replies score below most local models (s_g < s_l gives alpha_min), so only the leaking
client's rounds earn much more than alpha_min, and 10 contexts resolve a PII rate in tenths.
docs/methods/feddtre.md gives the larger run where the alphas separate clearly (0.203 against 0.110).
"""

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from test_determinism import serve

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.config.node_local import from_run
from fedsim.flower.strategies import strategy_utils
from fedsim.results.outputs import RunOutput
from fedsim.runtime import server_app
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_experiments.feddtre import protocol as feddtre

DATA = data_root_override()

pytestmark = pytest.mark.slow  # base SFT, trust evaluator and adapters built here: minutes

CLIENTS, ROUNDS, CONTAMINATED = 3, 3, 1
IID = f"{{_target_: flwr_datasets.partitioner.IidPartitioner, num_partitions: {CLIENTS}}}"
FEDDTRE = (
    "{_target_: fedsim_strategies.trust_alpha.TrustAlpha, k0: 0.7, k_growth: 0.1, midpoint: 0.01, "
    "alpha_min: 0.1, alpha_max: 1.0}"
)
SLICE = [
    "experiment=feddtre_paper",
    DATA,
    f"task.num_clients={CLIENTS}",
    "task.max_conversations=60",
    "~task.datasets.cmu_dog",
    "~task.datasets.persona_chat.partitioner",
    f"+task.datasets.persona_chat.partitioner={IID}",
    "task.trust.contexts_per_client=10",
    f"task.contamination.clients=[{CONTAMINATED}]",
    "task.contamination.share=1.0",
    "protocol.generator.base_sft_steps=40",
    "protocol.generator.base_sft_batch_size=8",
    "protocol.generator.base_heldout=10",
    "protocol.generator.max_length=96",
    "protocol.generator.local_steps=12",
    "protocol.generator.batch_size=8",
    "protocol.generator.lr=2.0e-3",
    "protocol.generator.lr_final=2.0e-3",
    "protocol.generator.eval_contexts=4",
    "protocol.generator.max_new_tokens=16",
    "protocol.test_contexts=4",
    "protocol.personal_contexts=10",
    f"protocol.clients_per_round={CLIENTS}",
    "protocol.evaluator.rounds=1",
    f"protocol.evaluator.clients_per_round={CLIENTS}",
    "protocol.evaluator.local_steps=4",
    "protocol.evaluator.heldout_contexts=5",
    f"num_rounds={ROUNDS}",
    "~protocol.methods",
    f"+protocol.methods={{feddtre: {{run: fedsim_experiments.feddtre.protocol.federated, strategy: {FEDDTRE}}}}}",
]


def play(cfg, clients: int) -> dict:
    """The run of ``cfg`` in process over ``clients`` real ClientApps: its results.json."""
    grid = InProcessGrid(
        {
            1000 + p: functools.partial(
                serve, partition=p, num_partitions=clients, node=from_run(cfg)
            )
            for p in range(clients)
        }
    )
    patch = pytest.MonkeyPatch()
    patch.setattr(
        strategy_utils, "random", strategy_utils.random
    )  # seed_server replaces it: given back
    try:
        server_app._run(grid, cfg, RunOutput(cfg.results_dir))
    finally:
        patch.undo()
    return json.loads((Path(cfg.results_dir) / "results.json").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The slice's run, once: its results and the clients' kept state (kept after the run)."""
    tmp = tmp_path_factory.mktemp("feddtre-personal")
    cfg = compose(
        [
            *SLICE,
            f"results_dir={tmp / 'results'}",
            f"protocol.generator.base_dir={tmp / 'gen'}",
            f"client_state.dir={tmp / 'state'}",
            "client_state.keep=true",
        ]
    )
    return play(cfg, CLIENTS), tmp / "state"


@pytest.mark.exhaustive  # the module's run builds for 4 min; tests/test_feddtre_power.py plays FedDTRE in 30 s
def test_every_client_evaluates_its_own_model_beside_the_global_one(run):
    """Every client trained every round and keeps its own mix: its personalized model is
    away from the global one (FedAvg's case, the global model itself, is in the e2e test)."""
    r, _ = run
    feddtre = r["methods"]["feddtre"]["persona_chat"]["personalized"]
    assert [c["partition"] for c in feddtre["clients"]] == list(range(CLIENTS))
    assert r["faults"]["persona_chat/feddtre/personal"][str(ROUNDS + 1)]["accepted"] == CLIENTS
    for c in feddtre["clients"]:
        assert c["kept_local"] and c["distance_to_global"] > 0 and c["contexts"] == 10
        assert c["gain_trust_bertscore"] == pytest.approx(
            c["trust_bertscore"] - c["global_trust_bertscore"]
        )
    assert feddtre["distance_to_global"]["min"] > 0 and feddtre["trust_bertscore"]["std"] >= 0


@pytest.mark.exhaustive  # the module's run builds for 4 min; tests/test_feddtre_power.py plays FedDTRE in 30 s
def test_the_feddtre_local_model_persists_across_rounds(run):
    """Each client's W_local is saved every round (the two newest kept), and each round's is
    not the last one's: the client carries on from its own model."""
    _, state = run
    (folder,) = state.iterdir()
    for p in range(CLIENTS):
        kept = sorted((folder / f"client-{p}").glob("generator-persona_chat-feddtre.r*.npz"))
        assert [k.name for k in kept] == [
            f"generator-persona_chat-feddtre.r{t}.npz" for t in (ROUNDS - 1, ROUNDS)
        ]
        older, newer = (np.load(k) for k in kept)
        assert any(not np.array_equal(older[k], newer[k]) for k in older.files)


@pytest.mark.exhaustive  # the module's run builds for 4 min; tests/test_feddtre_power.py plays FedDTRE in 30 s
def test_a_contaminated_client_leaks_and_scores_lower(run):
    """Its personalized replies leak PII wording more often than any clean client's, its
    local replies' trust score s_l is lower than the clean clients' (mean over rounds), and the
    trust evaluator pulls it towards the global model: its mean alpha is the larger."""
    r, _ = run
    c = r["contamination"]
    assert c["clients"] == [CONTAMINATED] and c["share"] == 1.0
    groups = c["methods"]["feddtre"]["persona_chat"]
    assert (
        groups["contaminated"]["client_rounds"] == ROUNDS
        and groups["clean"]["client_rounds"] == 2 * ROUNDS
    )
    assert all(0.1 - 1e-9 <= g["alpha"] <= 1.0 for g in groups.values())
    assert groups["contaminated"]["s_local"] < groups["clean"]["s_local"], groups
    assert groups["contaminated"]["alpha"] > groups["clean"]["alpha"], groups
    rows = {
        row["partition"]: row
        for row in r["methods"]["feddtre"]["persona_chat"]["personalized"]["clients"]
    }
    clean = [rows[p]["pii_rate"] for p in rows if p != CONTAMINATED]
    assert rows[CONTAMINATED]["pii_rate"] > max(clean), rows
    assert groups["contaminated"]["personal_pii_rate"] == rows[CONTAMINATED]["pii_rate"]


def test_more_clients_per_round_than_clients_is_refused_at_once():
    """Flower's sampling would wait for nodes that never come, until the round timeout."""
    cfg = compose(
        ["experiment=feddtre_paper", DATA, "task.num_clients=2", "protocol.clients_per_round=3"]
    )
    with pytest.raises(ValueError, match="clients_per_round=3 but the task has 2 clients"):
        feddtre.run(None, cfg, None, None)
