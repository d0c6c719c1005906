"""Bad input answers fast with a clear message and exit code 2, before Flower starts. The first
test runs the console script; the others call its ``main`` in this process (``fedsim_refusal``)."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import FEDSIM, fedsim_refusal, fedsim_run
from fedsim.config.data import resolve_data_root


def test_wrong_group_choice_names_valid_choices():
    code, log = fedsim_run("strategy=fedavgg")
    assert code == 2
    valid = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "strategy").glob("*.yaml"))
    assert f"'fedavgg' is not a strategy; valid choices: {', '.join(valid)}" in log


def test_unknown_key_suggests_the_close_one():
    code, log = fedsim_refusal("strategy.noise_multipler=2")
    assert code == 2
    assert "noise_multiplier" in log and "Unknown config key" in log


def test_bad_strategy_value():
    code, log = fedsim_refusal("strategy.noise_multiplier=-1")
    assert code == 2 and "noise_multiplier must be >= 0" in log


def test_missing_data_names_the_path(tmp_path):
    code, log = fedsim_refusal(f"data_root={tmp_path}")
    assert code == 2
    assert str(tmp_path / "topical_chat") in log and "github.com/alexa/Topical-Chat" in log


def test_missing_data_root(tmp_path):
    code, log = fedsim_refusal(f"data_root={tmp_path}/nope")
    assert code == 2 and "No data root found" in log


def test_wrong_type_names_the_key_before_anything_starts():
    code, log = fedsim_refusal("num_rounds=abc")
    assert code == 2 and "full_key: num_rounds" in log and "SuperLink" not in log


def test_a_key_without_a_value_is_refused_before_anything_starts():
    """conf/ holds every value and the schemas none: a key left without one fails composition
    or the protocol's dataclass, never a running process."""
    for override, refusal in (
        ("~protocol.alpha", "protocol.alpha: missing mandatory value"),
        ("~seed", "No value for seed"),
        ("hardware.waits.pull_backoff=???", "No value for hardware.waits.pull_backoff"),
    ):
        code, log = fedsim_refusal(override)
        assert code == 2 and refusal in log and "SuperLink" not in log, log


def test_unknown_protocol_callable():
    code, log = fedsim_refusal("protocol.run=fedsim_experiments.fedtp.protocol.rnu")
    assert code == 2 and "protocol.run does not resolve" in log


def test_protocol_block_is_typed():
    code, log = fedsim_refusal("protocol.dp_seeds=two")
    assert code == 2 and "protocol.dp_seeds: expected int, got 'two'" in log


def test_feddtre_partitions_that_do_not_give_num_clients_are_refused_before_anything_starts():
    code, log = fedsim_refusal("experiment=feddtre_paper", "task.num_clients=7")
    assert (
        code == 2 and "gives 10 clients but task.num_clients is 7" in log and "SuperLink" not in log
    )


def test_remote_superlink_needs_its_ca():
    code, log = fedsim_refusal("hardware=deploy_remote", "hardware.superlink=10.0.0.1:9093")
    assert code == 2 and "hardware.certificates" in log and "SuperLink" in log


def test_missing_certificate_files_are_named(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    code, log = fedsim_refusal("hardware=deploy_local", f"hardware.certificates={tmp_path}")
    assert code == 2 and str(tmp_path / "superlink.pem") in log and "fedsim certs" in log


def test_a_client_layout_that_leaves_a_supernode_empty_is_refused():
    code, log = fedsim_refusal("hardware.num_clients=5", "hardware.num_supernodes=10")
    assert code == 2 and "5 clients do not fit 10 SuperNodes" in log and "SuperLink" not in log
    code, log = fedsim_refusal("hardware.clients_per_supernode=0")
    assert code == 2 and "clients_per_supernode must be >= 1" in log


@pytest.mark.parametrize(
    "overrides, named",
    [
        (
            ["experiment=feddtre_paper", "protocol.clients_per_round=12"],
            "protocol.clients_per_round=12",
        ),
        (["num_rounds=0"], "num_rounds must be >= 1"),
        (["results_dir=<a file>"], "results_dir must be a folder"),
        (["+foo=1"], "Unknown config key 'foo'"),
        (["+hardware.foo=1"], "Unknown config key 'hardware.foo'"),
        (
            ["+task.splitz=[a]"],
            "Unknown config key 'task.splitz'. Did you mean: splits, split_seed?",
        ),
        (["hardware.num_clients=0"], "hardware.num_clients must be >= 1 (null: all), got 0"),
        (["hardware.client_backend=rows"], "hardware.client_backend must be one of"),
        (
            ["hardware.client_backend=batched"],
            "hardware.client_backend must be messages unless hardware.clients_per_supernode > 1",
        ),
        (
            ["experiment=fedtp_paper", "protocol.lambdas=0.1"],
            "protocol.lambdas: expected list[float], got 0.1",
        ),
        (
            [
                "privacy=dp_server_fixed",
                "experiment=fede4rag_paper",
                "privacy.wrapper.noise_multiplier=high",
            ],
            "privacy.wrapper.noise_multiplier must be > 0",
        ),
        (
            ["experiment=fede4rag_paper", "strategy=fedavg", "strategy.fraction_train=high"],
            "strategy.fraction_train: expected float, got 'high'",
        ),
        (["task.max_per_split=abc"], "task.max_per_split: expected int | None, got 'abc'"),
        (
            ["task.unit=turn"],
            "task.unit must be one of ('conversation',), got 'turn'",
        ),  # turns are not independent
        (
            ["experiment=fedtp", "strategy=fedprox", "strategy.proximal_mu=10"],
            "cannot run strategy FedProx: FedTP's clients train no model",
        ),  # once FedAvg under FedProx's name
        (
            ["privacy.audit.enabled=true", "privacy.audit.canaries=300"],
            "privacy.audit.canaries=300 exceeds half",
        ),
        (["hardware=ray_cluster"], "hardware.ray_address must be given with hardware=ray_cluster"),
        (
            ["hardware=ray_cluster", "hardware.ray_address=head"],
            "hardware.ray_address must be the cluster head's host:port",
        ),
        (
            ["hardware=ray_cluster", "hardware.ray_address=127.0.0.1:1"],
            "hardware.ray_address: nothing answers at 127.0.0.1:1",
        ),
        (
            [
                "hardware=ray_cluster",
                "hardware.ray_address=127.0.0.1:1",
                "hardware.private_network=true",
            ],
            "hardware.ray_address must be null with hardware.private_network=true",
        ),
        (
            ["hardware=deploy_local", "hardware.ray_address=127.0.0.1:1"],
            "hardware.ray_address must be null with hardware.backend=deployment",
        ),
        (
            [
                "hardware=deploy_local",
                "hardware.clientapp_preload=null",
            ],  # deploy_local's workers: 1
            "hardware.clientapp_workers must be 0 unless hardware.clientapp_preload is set",
        ),
        (
            ["hardware=deploy_local", "hardware.clientapp_workers=-1"],
            "hardware.clientapp_workers must be >= 0, got -1",
        ),
        (
            ["experiment=fedbiscuit_paper", "task.minority_preference.kind=opposite"],
            "task.minority_preference.kind='opposite' is not one of ('reversed', 'second_criterion', 'rules')",
        ),
    ],
)
def test_what_the_run_would_fail_on_is_refused_before_any_process_starts(
    overrides, named, tmp_path
):
    """Each of these once started the run's processes and failed in them (a traceback after a
    minute, or a full run with the setting ignored): now exit 2, the key named, no SuperLink."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, log = fedsim_refusal(*(o.replace("<a file>", str(a_file)) for o in overrides))
    assert code == 2 and named in log and "SuperLink" not in log, log


def test_a_machine_without_network_namespaces_is_refused_before_anything_starts():
    """Where this user may not make a network namespace (here: inside a user namespace whose
    limit of network namespaces is 0), a local run is refused with the two ways on; with
    hardware.private_network=false it goes on."""
    denied = [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"',
        "sh",
    ]
    if subprocess.run([*denied, "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespace here to deny network namespaces in")
    refused = subprocess.run(
        [*denied, FEDSIM, "run", "--cfg", "job"], capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "refuses this user a network namespace" in refused.stderr
    assert "hardware.private_network=false" in refused.stderr
    assert "apparmor_restrict_unprivileged_userns" in refused.stderr
    shared = subprocess.run(
        [*denied, FEDSIM, "run", "--cfg", "job", "hardware.private_network=false"],
        capture_output=True,
        text=True,
    )
    assert shared.returncode == 0 and "private_network: false" in shared.stdout, shared.stderr


def test_feddtre_base_corpus_missing_is_refused_before_anything_starts(tmp_path):
    """FedDTRE's generator base trains on Topical-Chat: a data root holding only the clients'
    Synthetic-Persona-Chat used to pass the check and fail 48 s into the run, inside the
    ServerApp (seen on a GPU machine, 2026-11-26)."""
    (tmp_path / "synthetic_persona_chat").symlink_to(resolve_data_root() / "synthetic_persona_chat")
    code, log = fedsim_refusal("experiment=feddtre_power_pilot", f"data_root={tmp_path}")
    assert code == 2, log
    assert str(tmp_path / "topical_chat" / "conversations" / "valid_freq.json") in log


@pytest.mark.parametrize("plant", ["open to others", "another user's"])
def test_a_results_dir_another_user_can_plant_links_in_is_refused(plant, tmp_path):
    """The attack: another local user makes the folder a run will write its results under (e.g.
    `outputs/` in a shared /tmp) or may write into it, and plants links where results.json or
    summary.md will go, or swaps finished results. Such a folder is refused before anything starts."""
    shared = tmp_path / "shared"
    shared.mkdir()
    if plant == "open to others":
        shared.chmod(0o777)
    elif os.getuid() == 0:
        os.chown(shared, 4242, 4242)
    else:
        pytest.skip("making a folder another user's needs root")
    code, log = fedsim_refusal(f"results_dir={shared}/outputs")
    assert code == 2 and f"results_dir: {shared} " in log and "SuperLink" not in log, log
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    with pytest.raises(
        AssertionError, match="not refused"
    ):  # a folder of this user's goes on to launch
        fedsim_refusal(f"results_dir={own}/outputs")
