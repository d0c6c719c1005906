"""FedE4RAG end to end through the real simulation: 2 company clients, 1 round, HE on, on a
small FinanceBench slice with the offline MiniLM (LoRA)."""

from conftest import fedsim_run, read_results

from tasks.financebench_rag.retrieval import METRICS

DROP = [f"~protocol.methods.{m}" for m in ("alone_largest", "alone_smallest", "centralized",
                                           "fedavg")]


def test_two_clients_one_round_he_matches_plaintext(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        "experiment=fede4rag_paper", f"results_dir={out}",
        "task.companies=[AES Corporation,Boeing]", "task.pages_per_client=30",
        "task.n_valid=4", "task.n_test=6", "task.corpus_pages_per_doc=8",
        f"task.embedding_cache={tmp_path / 'cache'}", f"task.he.key_dir={tmp_path / 'keys'}",
        f"task.state_dir={tmp_path / 'state'}", "protocol.num_rounds=1",
        "protocol.local_steps=2", "protocol.batch_size=4", *DROP, timeout=600)
    assert code == 0, log[-3000:]
    r = read_results(out)
    assert r["budget_steps"] == 4 and set(r["clients"]) == {"0", "1"}
    assert [c["companies"] for c in r["clients"].values()] == [["AES Corporation"], ["Boeing"]]
    assert list(r["methods"]) == ["vanilla", "fede4rag_no_he", "fede4rag"]
    he, plain = r["methods"]["fede4rag"], r["methods"]["fede4rag_no_he"]
    for split in ("valid", "test"):
        assert he[split]["questions"] == {"valid": 4, "test": 6}[split]
        for metric in METRICS:
            assert 0.0 <= he[split][metric] <= 1.0
            # the encrypted average is FedAvg's up to CKKS error: the same retrieval
            assert abs(he[split][metric] - plain[split][metric]) < 1e-3
    assert he["rounds"]["1"]["replies-accepted"] == 2
    cost = r["he"]
    assert cost["he"]["bytes_per_client_round"] > 10 * cost["plain"]["bytes_per_client_round"]
    assert cost["he"]["encrypt_seconds_per_client_round"] > 0
    assert (out / "summary.md").read_text().count("| fede4rag |") == 2
    assert (out / "retrieval_by_method.png").is_file()
    keys = list((tmp_path / "keys").iterdir())
    assert any(k.suffix == ".secret" for k in keys)  # the clients' key stays on the client side
