"""Many logical clients per SuperNode through the real Ray simulation (``hardware.clients_per_supernode``):
FedTP's release is the one of one SuperNode per client, and a FedE4RAG federation (a different
task, HE state kept per client across rounds) runs with two clients on one SuperNode."""

import numpy as np

from conftest import fedsim_run, read_results


def _aggregate(tmp_path, name, *overrides):
    out = tmp_path / name
    code, log = fedsim_run("experiment=fedtp_aggregate", "strategy.noise_multiplier=0",
                           "task.max_per_split=6", f"results_dir={out}", *overrides)
    assert code == 0, log[-3000:]
    return read_results(out)


def test_fedtp_release_is_the_same_with_many_clients_per_supernode(tmp_path):
    one_each = _aggregate(tmp_path, "one-each")
    sharded = _aggregate(tmp_path, "sharded", "hardware.clients_per_supernode=6")
    assert (one_each["clients"], one_each["supernodes"]) == (24, 24)
    assert (sharded["clients"], sharded["supernodes"]) == (24, 4)
    np.testing.assert_allclose(sharded["released"], one_each["released"], rtol=0, atol=1e-12)
    assert sharded["faults"]["aggregate/train"]["1"]["accepted"] == 24


def test_fede4rag_runs_two_clients_on_one_supernode(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        "experiment=fede4rag_paper", f"results_dir={out}", "hardware.clients_per_supernode=2",
        "task.companies=[AES Corporation,Boeing]", "task.pages_per_client=30",
        "task.n_valid=4", "task.n_test=6", "task.corpus_pages_per_doc=8",
        f"task.embedding_cache={tmp_path / 'cache'}", f"task.he.key_dir={tmp_path / 'keys'}",
        f"task.state_dir={tmp_path / 'state'}", "num_rounds=2", "protocol.local_steps=2",
        "protocol.batch_size=4", "protocol.eval_pages_per_message=64",
        "~protocol.methods", "+protocol.methods={fede4rag: {run: experiments.fede4rag.federated, "
        "kd_weight: 1.0, he: true}}", timeout=900)
    assert code == 0, log[-3000:]
    assert "fedsim: 1 SuperNodes" in log
    r = read_results(out)
    assert [c["companies"] for c in r["clients"].values()] == [["AES Corporation"], ["Boeing"]]
    rounds = r["methods"]["fede4rag"]["rounds"]
    assert [rounds[k]["clients"] for k in ("1", "2")] == [2, 2]
    assert all(c["failed"] == c["malformed"] == c["timed_out"] == 0
               for phase in r["faults"].values() for c in phase.values())
