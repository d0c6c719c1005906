"""``privacy=secagg`` through ``fedsim run``: refused before the run (exit 2, the strategy's own
reason) where the strategy needs single updates, and run for real in Flower's Ray simulation,
where the unmasked mean trains the model plaintext FedAvg trains (the same seed, the same
metrics within the quantization bound)."""

import json

import pytest

from conftest import fedsim_refusal, fedsim_run


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


SETTING = [
    "experiment=turn_sentiment_fedavg",
    "hardware.num_clients=6",
    "protocol.clients_per_round=6",
    "num_rounds=2",
]


@pytest.mark.e2e
@pytest.mark.slow
def test_secagg_trains_the_model_plaintext_fedavg_trains(tmp_path):
    results = {}
    for privacy in ("none", "secagg"):
        out = tmp_path / privacy
        code, log = fedsim_run(*SETTING, f"privacy={privacy}", f"results_dir={out}")
        assert code == 0, log[-3000:]
        results[privacy] = json.loads((out / "results.json").read_text())
    plain, secure = results["none"], results["secagg"]
    assert secure["accuracy"] == pytest.approx(plain["accuracy"], abs=1e-3)
    assert secure["loss"] == pytest.approx(plain["loss"], abs=1e-3)
    phases = secure["faults"]
    for phase in ("secagg-keys", "secagg-share", "train", "secagg-check", "secagg-unmask"):
        assert phases[f"train/{phase}"]["2"]["accepted"] == 6, phases
