"""FedDTRE end to end through the Ray simulation on a small slice of both datasets: base SFT,
federated trust evaluator, the six methods on both datasets, with one client's generator
replies made NaN: they are rejected and counted, and the run goes on. After each federated
method every client evaluates its personalized model beside the global one."""

import numpy as np
import pytest

from conftest import fedsim_run, read_results

# minutes through Ray: the default suite plays each phase of the method through its real clients in
# process (tests/test_strategy_matrix.py, tests/test_reply_fuzz.py); this run is exhaustive
pytestmark = [pytest.mark.e2e, pytest.mark.exhaustive]

IID = "{_target_: flwr_datasets.partitioner.IidPartitioner, num_partitions: 2}"
SLICE = [
    "experiment=feddtre_paper",
    "task.num_clients=2",
    "task.max_conversations=30",
    "~task.datasets.persona_chat.partitioner",
    f"+task.datasets.persona_chat.partitioner={IID}",
    "~task.datasets.cmu_dog.partitioner",
    f"+task.datasets.cmu_dog.partitioner={IID}",
    "task.trust.contexts_per_client=5",
    "protocol.generator.base_sft_steps=2",
    "protocol.generator.base_heldout=10",
    "protocol.generator.local_steps=2",
    "protocol.generator.batch_size=2",
    "protocol.generator.eval_contexts=2",
    "protocol.generator.max_new_tokens=8",
    "protocol.test_contexts=3",
    "protocol.evaluator.rounds=1",
    "protocol.evaluator.clients_per_round=2",
    "protocol.evaluator.local_steps=2",
    "protocol.evaluator.heldout_contexts=5",
    "num_rounds=2",
    "protocol.personal_contexts=2",
    "protocol.clients_per_round=2",
]
METHODS = ["base", "fedavg", "fedprox", "fixed_alpha_0p5", "fixed_alpha_0p25", "feddtre"]
MIXING = ["fixed_alpha_0p5", "fixed_alpha_0p25", "feddtre"]


def test_feddtre_runs_every_method_on_both_datasets(tmp_path):
    out = tmp_path / "results"
    state = tmp_path / "client-state"
    code, log = fedsim_run(
        *SLICE,
        f"results_dir={out}",
        f"protocol.generator.base_dir={tmp_path / 'gen'}",
        "faults.nan=[1]",
        f"client_state.dir={state}",
        "client_state.keep=true",
        timeout=900,
    )
    assert code == 0, log[-3000:]
    r = read_results(out)
    assert list(r["methods"]) == METHODS
    for name in METHODS:
        for dataset in ("persona_chat", "cmu_dog"):
            m = r["methods"][name][dataset]
            assert (
                set(m) >= {"bleu1", "bleu4", "rouge1", "rouge2", "trust_bertscore"}
                and m["contexts"] == 3
            )
            assert 0 <= m["bleu1"] <= 100 and -1 <= m["trust_bertscore"] <= 1
    ev = r["evaluator"]
    assert set(ev["before"]) == {"persona_chat", "cmu_dog", "all"} and 0 <= ev["auc_after"] <= 1
    assert ev["before"]["all"]["examples"] == 30  # 5 held-out contexts x 3 responses x 2 datasets
    # FedDTRE: every round records each accepted client's alpha and trust scores; partition 1's
    # NaN replies are rejected and counted, so one client per round remains
    for dataset in ("persona_chat", "cmu_dog"):
        rounds = r["alpha"]["feddtre"][dataset]
        assert list(rounds) == ["1", "2"]
        for row in rounds.values():
            assert (
                0.1 <= row["min"] <= row["mean"] <= row["max"] <= 1.0 and len(row["clients"]) == 1
            )
            assert {"s-local", "s-global"} <= set(row["clients"][0])
        assert {v["mean"] for v in r["alpha"]["fixed_alpha_0p25"][dataset].values()} == {0.25}
        faults = r["faults"][f"{dataset}/feddtre/train"]
        assert all(f["malformed"] == 1 and f["accepted"] == 1 for f in faults.values())
        comm = r["communication"]
        assert (
            comm["feddtre"][dataset]["bytes_per_round"]
            > comm["fedavg"][dataset]["bytes_per_round"]
            > 0
        )
        assert comm["base"][dataset]["bytes_per_round"] == 0
    assert r["base"]["sft"]["steps"] == 2 and "Topical-Chat" in r["base"]["sft"]["data"]
    assert (out / "alpha_per_round.png").is_file() and "trust_bertscore" in (
        out / "summary.md"
    ).read_text()
    _check_personalized(r, (out / "summary.md").read_text())
    _check_kept_local_models(state)
    assert "state-bytes" in (out / "metrics.csv").read_text()  # disk per mixing client, per round


def _check_personalized(r, summary):
    """Every client reports its personalized model and the global one on its own contexts
    after every federated method (partition 1's NaN train replies do not touch its evaluation).
    A mixing client's personalized model is its own W_local: partition 1's, never averaged in,
    is away from the global model; partition 0's is the global model to the bit, since its reply
    was the only one averaged. A FedAvg / FedProx client's is the global model (gain 0)."""
    for dataset in ("persona_chat", "cmu_dog"):
        assert "personalized" not in r["methods"]["base"][dataset]
        for name in METHODS[1:]:
            p = r["methods"][name][dataset]["personalized"]
            assert [c["partition"] for c in p["clients"]] == [0, 1] and {
                c["contexts"] for c in p["clients"]
            } == {2}
            assert r["faults"][f"{dataset}/{name}/personal"]["3"]["accepted"] == 2
            assert set(p) >= {
                "bleu1",
                "rouge2",
                "trust_bertscore",
                "pii_rate",
                "global_bleu1",
                "gain_trust_bertscore",
            }
            assert (
                p["bleu1"]["min"] <= p["bleu1"]["mean"] <= p["bleu1"]["max"]
                and p["bleu1"]["std"] >= 0
            )
            mixing = name in MIXING
            for c in p["clients"]:
                assert c["kept_local"] == mixing and (c["distance_to_global"] > 0) == (
                    mixing and c["partition"] == 1
                )
                assert c["distance_to_global"] > 0 or all(
                    c[f"gain_{k}"] == 0 for k in ("bleu1", "trust_bertscore")
                )
        assert f"### {dataset}: personalized models" in summary


def _check_kept_local_models(state):
    """Mixing clients keep their own W_local across rounds on their side (FedAvg / FedProx keep
    nothing), and each round's differs from the last."""
    (run,) = state.iterdir()
    kept = sorted(p.name for p in (run / "client-0").iterdir())
    assert kept == sorted(
        f"generator-{d}-{m}.r{rnd}.npz"
        for d in ("persona_chat", "cmu_dog")
        for m in ("fixed_alpha_0p5", "fixed_alpha_0p25", "feddtre")
        for rnd in (1, 2)
    )
    first, second = (
        np.load(run / "client-0" / f"generator-cmu_dog-feddtre.r{k}.npz") for k in (1, 2)
    )
    assert first.files == second.files and any(
        not np.array_equal(first[k], second[k]) for k in first.files
    )
