"""``privacy=secagg`` through ``fedsim run``: refused before the run (exit 2, the strategy's own
reason) where the strategy needs single updates, and run for real in Flower's Ray simulation,
where the unmasked mean trains the model plaintext FedAvg trains (the same seed, the same
metrics within the quantization bound), and through ``hardware=deploy_local`` (a SuperLink and 2
SuperNodes, TLS and node authentication), where it gives the simulation's results. The Docker
topology's run is ``tests/test_docker.py``'s."""

import pytest
from test_e2e_parity import comparable

from conftest import fedsim_refusal, fedsim_run, read_results


@pytest.mark.parametrize(
    "experiment, strategy, reason",
    [
        ("feddtre_paper", "trust_alpha", "FedDTRE's trust"),
        ("feddtre_paper", "krum", "SecAgg+ gives the server their sum only"),
        ("fedbiscuit_paper", "qfedavg", "each client's plaintext loss"),
        ("fedtp", "dp_mean", "distributed DP"),
    ],
)
def test_a_strategy_that_needs_single_updates_is_refused_before_the_run(
    experiment, strategy, reason
):
    code, err = fedsim_refusal(f"experiment={experiment}", f"strategy={strategy}", "privacy=secagg")
    assert code == 2 and reason in err, err


# the simulation's and the deployment's federation alike: 6 clients on 2 SuperNodes, 3 each
LAYOUT = [
    "experiment=turn_sentiment_fedavg",
    "num_rounds=2",
    "hardware.num_clients=6",
    "hardware.clients_per_supernode=3",
    "hardware.num_supernodes=2",
    "seed=0",
]


def run_on(tmp_path, backend: str, privacy: str) -> tuple[dict, str]:
    out = tmp_path / f"{backend}-{privacy}"
    code, log = fedsim_run(
        *LAYOUT,
        f"privacy={privacy}",
        f"hardware={backend}",
        f"results_dir={out}",
        f"client_state.dir={tmp_path / 'state'}",
        timeout=900,
    )
    assert code == 0, log[-3000:]
    return read_results(out), log


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict:
    """The SecAgg+ run in Flower's Ray simulation, once for both tests that compare with it
    (they share an xdist group, so one worker runs it)."""
    return run_on(tmp_path_factory.mktemp("secagg"), "cpu_2", "secagg")[0]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.xdist_group("secagg-simulated")
def test_secagg_trains_the_model_plaintext_fedavg_trains(tmp_path, simulated):
    plain = run_on(tmp_path, "cpu_2", "none")[0]
    assert simulated["accuracy"] == pytest.approx(plain["accuracy"], abs=1e-3)
    assert simulated["loss"] == pytest.approx(plain["loss"], abs=1e-3)
    assert every_exchange_reached_all(simulated["faults"], 6, rounds=2)


def every_exchange_reached_all(faults: dict, clients: int, rounds: int) -> bool:
    """Each round's SecAgg+ exchanges were answered by every client; keys were asked in round 1
    only (each later round runs on the keys sent with the unmask replies before it)."""
    phases = ("secagg-share", "train", "secagg-check", "secagg-unmask")
    return (
        all(
            faults[f"train/{p}"][str(r)]["accepted"] == clients
            for p in phases
            for r in range(1, rounds + 1)
        )
        and list(faults["train/secagg-keys"]) == ["1"]
        and faults["train/secagg-keys"]["1"]["accepted"] == clients
    )


def signature_bytes(results: dict) -> dict:
    """results.json less the bytes of the phases that carry ECDSA signatures (the check's
    replies, the unmask's requests): a DER signature is 70 to 72 bytes, by its random nonce."""
    for phase, direction in (("secagg-check", "bytes_up"), ("secagg-unmask", "bytes_down")):
        for row in results["communication"][f"train/{phase}"].values():
            row.pop(direction)
    return results


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.xdist_group("secagg-simulated")
def test_secagg_deployed_gives_the_simulations_results(tmp_path, simulated):
    """SecAgg+ over TLS with node authentication, a process per SuperNode, ends where the Ray
    simulation of the same seed and layout ends: results.json equal number for number but for
    timings and the signatures' bytes."""
    deployed, log = run_on(tmp_path, "deploy_local", "secagg")
    assert "(TLS + node authentication)" in log
    assert every_exchange_reached_all(deployed["faults"], 6, rounds=2)
    assert signature_bytes(comparable(deployed)) == signature_bytes(comparable(simulated))
