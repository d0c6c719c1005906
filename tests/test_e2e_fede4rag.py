"""FedE4RAG end to end through the real simulation: every method runner (vanilla, alone,
centralized, FedAvg, FedE4RAG with and without HE), 2 company clients as two logical clients
of one SuperNode (``hardware.clients_per_supernode``: HE state kept per client across rounds),
2 rounds, on a small FinanceBench slice with the offline MiniLM (LoRA); the corpus encoded in
bounded pieces by both clients (``protocol.eval_nodes=2``)."""

import pytest
from omegaconf import OmegaConf

from conftest import data_root_override, fedsim_run, read_results
from fedsim.config.compose import compose
from fedsim_tasks.financebench_rag.inference import corpus_encoder
from fedsim_tasks.financebench_rag.retrieval import METRICS, evaluation_data, score_splits
from fedsim_tasks.hf import build_encoder

# minutes through Ray: the default suite plays each phase of the method through its real clients in
# process (tests/test_strategy_matrix.py, tests/test_reply_fuzz.py); this run is exhaustive
pytestmark = [pytest.mark.e2e, pytest.mark.exhaustive]

SLICE = [
    "experiment=fede4rag_paper",
    "task.companies=[AES Corporation,Boeing]",
    "task.pages_per_client=30",
    "task.n_valid=4",
    "task.n_test=6",
    "task.corpus_pages_per_doc=8",
]


def vanilla_metrics() -> dict:
    """The vanilla model's metrics on the slice, encoded in this process in one go (torch)."""
    cfg = compose([*SLICE, data_root_override()])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    model = build_encoder(task["model"], task["max_seq_length"], task["lora"], task["seed"])
    questions, corpus = evaluation_data(cfg.data_root, task)
    emb = corpus_encoder(model, "torch", 2)(list(corpus.values()))
    return score_splits(model, cfg.data_root, questions, list(corpus), emb, task, ["valid", "test"])


def test_every_method_on_a_small_slice(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        *SLICE,
        f"results_dir={out}",
        "task.embedding_cache=null",
        f"task.he.key_dir={tmp_path / 'keys'}",  # the run's own store
        f"client_state.dir={tmp_path / 'state'}",
        "num_rounds=2",
        "protocol.local_steps=1",
        "protocol.batch_size=4",
        "protocol.eval_pages_per_message=24",
        "protocol.eval_nodes=2",
        "hardware.clients_per_supernode=2",
        "protocol.methods.local_only=null",
        "protocol.methods.persistent_no_kd=null",  # tests/test_fede4rag_arms.py
        timeout=900,
    )
    assert code == 0, log[-3000:]
    assert "fedsim: 1 SuperNodes" in log
    r = read_results(out)
    assert r["budget_steps"] == 4 and set(r["clients"]) == {"0", "1"}
    assert [c["companies"] for c in r["clients"].values()] == [["AES Corporation"], ["Boeing"]]
    methods = r["methods"]
    assert list(methods) == [
        "vanilla",
        "alone_largest",
        "alone_smallest",
        "centralized",
        "fedavg",
        "fede4rag_no_he",
        "fede4rag",
    ]
    for name, m in methods.items():
        assert m["steps"] == (0 if name == "vanilla" else 4)
        for split in ("valid", "test"):
            assert m[split]["questions"] == {"valid": 4, "test": 6}[split]
            assert all(0.0 <= m[split][metric] <= 1.0 for metric in METRICS)
    assert {methods["alone_largest"]["partition"], methods["alone_smallest"]["partition"]} == {0, 1}
    # the pool of both clients' documents (task.pages_per_client caps the pooled pages too)
    assert methods["centralized"]["pairs"] > min(c["num-pairs"] for c in r["clients"].values())
    # each trained method evaluated its own weights (the protocol checks the key against the
    # aggregate it holds; under HE the clients' copy), never the vanilla model's
    trained_keys = [m["weights_key"] for n, m in methods.items() if n != "vanilla"]
    assert methods["vanilla"]["weights_key"] not in trained_keys
    assert methods["fedavg"]["weights_key"] != methods["fede4rag_no_he"]["weights_key"]
    he, plain = methods["fede4rag"], methods["fede4rag_no_he"]
    for split in ("valid", "test"):
        for metric in METRICS:  # the encrypted average is FedAvg's up to CKKS error
            assert abs(he[split][metric] - plain[split][metric]) < 1e-3
    assert [he["rounds"][k]["clients"] for k in ("1", "2")] == [2, 2]
    # the LoRA update fits one message: encrypted in the train reply (round 1's aggregate
    # carried in round 2's train message), no chunk exchanges
    assert he["rounds"]["2"]["one-trip"] == 1 and "fede4rag/he-encrypt" not in r["faults"]
    cost = r["round_cost"]  # per federated method
    assert set(cost) == {"fedavg", "fede4rag_no_he", "fede4rag"}
    assert (
        cost["fede4rag"]["bytes_per_client_round"]
        > 10 * cost["fede4rag_no_he"]["bytes_per_client_round"]
    )
    assert cost["fede4rag"]["encrypt_seconds_per_client_round"] > 0
    assert "encrypt_seconds_per_client_round" not in cost["fede4rag_no_he"]
    # every phase went through the one messaging path and is counted
    faults, traffic = r["faults"], r["communication"]
    for phase in (
        "discover",
        "initial-weights",
        "alone_largest/train",
        "fedavg/train",
        "fede4rag/train",
        "fede4rag/he-install",
        "eval/fede4rag/encode",
        "eval/fede4rag/score",
    ):
        assert all(
            c["failed"] == c["malformed"] == c["timed_out"] == 0 for c in faults[phase].values()
        ), (phase, faults[phase])
    # pieces encoded two at a time, one per client, into one store: the vanilla metrics are those
    # of the whole corpus encoded at once
    waves = faults["eval/vanilla/encode"]
    assert (
        len(waves) > 1
        and waves["1"]["sent"] == 2
        and all(w["sent"] == w["accepted"] for w in waves.values())
    )
    assert traffic["eval/vanilla/encode"]["1"]["messages"] == 2
    assert "encoded on 2 node(s)" in log
    reference = vanilla_metrics()
    for split in ("valid", "test"):
        assert methods["vanilla"][split] == pytest.approx(
            {m: reference[f"{split}/{m}"] for m in METRICS}
            | {
                "questions": reference[f"{split}/questions"],
                "corpus_pages": reference[f"{split}/corpus-pages"],
                "corpus_entries": reference[f"{split}/corpus-entries"],
            },
            abs=1e-6,
        )
    # FedE4RAG's companies keep their own retrievers: round 1 starts from the global (the
    # teacher: KD exactly 0), round 2 from the company's own model (KD above 0); each own model
    # is evaluated on its node and differs from the global and from the other company's
    for name in ("fede4rag_no_he", "fede4rag"):
        rounds, local = methods[name]["rounds"], methods[name]["local"]
        assert (
            rounds["1"]["kd-first"] == pytest.approx(0.0, abs=1e-9)
            and rounds["2"]["kd-first"] > 1e-7
        )
        assert local["model"] == "own" and set(local["clients"]) == {"0", "1"}
        own_keys = {c["weights_key"] for c in local["clients"].values()}
        assert len(own_keys) == 2 and methods[name]["weights_key"] not in own_keys
        assert local["valid"]["ndcg@10"] == pytest.approx(
            sum(c["valid"]["ndcg@10"] for c in local["clients"].values()) / 2
        )
        assert all(c["failed"] == 0 for c in faults[f"eval/{name}/local/score"].values())
    assert methods["fedavg"]["local"]["model"] == "global"  # FedAvg keeps no local model
    assert methods["fedavg"]["local"]["test"] == {m: methods["fedavg"]["test"][m] for m in METRICS}
    summary = (out / "summary.md").read_text()
    # valid, test, own retrievers (valid, test), each client's questions (valid, test), per round (2 rounds), round cost
    assert summary.count("| fede4rag |") == 9
    assert (out / "retrieval_by_method.png").is_file()
    keys = list((tmp_path / "keys").iterdir())
    assert any(k.suffix == ".secret" for k in keys)  # the clients' key stays on the client side
