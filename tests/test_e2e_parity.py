"""Simulation-deployment parity: one seed, one small experiment per method family, run through
the Ray simulation and through ``hardware=deploy_local`` (a SuperLink and 2 SuperNodes, TLS and
node authentication), gives the same results.json: a deployment runs the method the paper tables
came from. FedTP's deployed run is also the default suite's deployment test (TLS, node
authentication, a process per message). The DP noise is public
(``privacy.reproducible_noise``: drawn from the seed, so both runs draw the same; the run's
secret would differ); every other random stream comes from the
seed by ``fedsim/seeding.py``, keyed by round and partition, never by Flower's node id or the
order replies arrive in (the Messenger hands replies back in partition order).

Compared exactly, every number: the same computation in the same order gives the same bits.
Left out: only what measures the machine (seconds, ``timings``, the provenance's times and
command, the checkpoint's counts). Both runs give the same 2-node federation (a simulation's
default is one node per client). FedTP's DP prior is noised (sigma 1 on 4 clipped rows): with
the run's secret instead of the public seed, its routers' error and support ratio differ."""

import pytest

from conftest import SMALL, fedsim_run, read_results
from fedsim.runtime import exchange_trace

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BACKENDS = ("hardware=cpu_2", "hardware=deploy_local")
LAYOUT = "hardware.num_supernodes=2"  # one federation for both: 2 nodes (the simulation's default: one per client)
FEDTP = [*SMALL, "task.max_per_split=2", "privacy.reproducible_noise=true", "seed=7"]
# FedE4RAG's FedAvg (LoRA on MiniLM) on two companies' first pages, one round, the corpus encoded
# in two pieces by OpenVINO (a deployment's second piece compiles the first's saved graph in a new process)
LORA = [
    "experiment=fede4rag_paper",
    "task.companies=[AES Corporation,Boeing]",
    "task.pages_per_client=12",
    "task.n_valid=4",
    "task.n_test=6",
    "task.corpus_pages_per_doc=4",
    "task.embedding_cache=null",
    "num_rounds=1",
    "protocol.local_steps=2",
    "protocol.batch_size=4",
    "protocol.eval_pages_per_message=40",
    "protocol.eval_local=false",
    "~protocol.methods",
    "+protocol.methods={fedavg: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 0.0, he: false}}",
    "seed=7",
]
MACHINE = {"timings", "provenance", "checkpoint"}


def comparable(value):
    """results.json without what measures the machine."""
    if isinstance(value, dict):
        return {
            k: comparable(v)
            for k, v in value.items()
            if k not in MACHINE and "seconds" not in k and not k.startswith("ms_")
        }
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def run_on(tmp_path, overrides: list[str], backend: str) -> tuple[dict, str]:
    out = tmp_path / backend.split("=")[1]
    code, log = fedsim_run(
        *overrides, backend, LAYOUT, f"results_dir={out}", f"client_state.dir={tmp_path / 'state'}"
    )
    assert code == 0, log[-3000:]
    return read_results(out), log


def simulated_and_deployed(tmp_path, overrides: list[str]) -> list[dict]:
    return [run_on(tmp_path, overrides, backend)[0] for backend in BACKENDS]


def test_fedtp_gives_the_same_results_simulated_and_deployed(tmp_path, monkeypatch):
    """Also the deployment's own checks: a SuperLink and two SuperNodes over TLS with node
    authentication, the run's messages served by one ClientApp worker per SuperNode forked from
    its warm process (``hardware.clientapp_workers``), and (``fedsim_run``) no process of the
    run left."""
    simulated, _ = run_on(tmp_path, FEDTP, BACKENDS[0])
    monkeypatch.setenv(exchange_trace.TRACE_ENV, str(tmp_path))
    deployed, log = run_on(tmp_path, FEDTP, BACKENDS[1])
    assert "deployment via SuperLink 127.0.0.1:" in log and "(TLS + node authentication)" in log
    prior = deployed["prior_clients"]
    assert deployed["supernodes"] == 2 and deployed["conversations"] == 8
    assert (prior["count"], prior["nodes"]) == (
        4,
        2,
    )  # each SuperNode hosts 2 validation conversations
    assert deployed["routers"]["fedmix"]["overall"]["turns"] > 0
    marks = exchange_trace.read(tmp_path)
    handled = [m for m in marks if m["event"] == "enter"]
    parents = {m["pid"]: m["parent"] for m in marks if m["event"] == "process-start"}
    assert (
        len(handled) >= 8 and len({m["pid"] for m in handled}) == 2
    )  # discover, prior, tune, test x 2 nodes
    assert all("multiprocessing.forkserver" in parents[m["pid"]] for m in handled), set(
        parents.values()
    )
    assert {phase for phase, _ in exchange_trace.breakdown(marks)} >= {
        "discover",
        "prior/train",
        "tune",
        "test",
    }
    assert (
        simulated["privacy"] == deployed["privacy"] and simulated["dp_sweep"]
    )  # the DP releases: noised alike
    assert comparable(deployed) == comparable(simulated)


@pytest.mark.exhaustive  # two FedE4RAG runs, minutes each: the default suite compares FedTP
def test_lora_retriever_gives_the_same_results_simulated_and_deployed(tmp_path):
    simulated, deployed = simulated_and_deployed(
        tmp_path, [*LORA, f"task.he.key_dir={tmp_path / 'keys'}"]
    )
    assert simulated["methods"]["fedavg"]["test"]["questions"] == 6
    assert comparable(deployed) == comparable(simulated)
