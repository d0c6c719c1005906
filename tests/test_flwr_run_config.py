"""`flwr run .`'s run config, as Flower parses and fuses it (what its SuperLink does) and the
ServerApp maps it: the typed keys of [tool.flwr.app.config] and the TOML presets reach the same
config as `fedsim run`'s overrides, a wrong value is refused with fedsim's message, an undeclared
key by Flower; the ServerApp says how the task's clients sit on the SuperNodes; `fedsim
federations` writes connections Flower reads."""

import logging
import tomllib

import pytest

from conftest import SMALL
from fedsim.config.compose import CONF_DIR, REFUSED, compose
from fedsim.config.data import REPO_ROOT
from fedsim.flower.cli import (
    SuperLinkConnection,
    _parse_federation_config_overrides,
    _run_simulation_settings,
    get_fused_config_from_dir,
    parse_config_args,
    read_superlink_connection,
)
from fedsim.run import cli
from fedsim.run.launcher import federation_config, simulation_env
from fedsim.runtime.server_app import RUN_CONFIG_KEYS, config_from_run, state_layout

PRESETS = sorted((CONF_DIR / "flwr").glob("*.toml"))


def fused(*args: str) -> dict:
    """The run config a ServerApp gets for ``flwr run . --run-config ARGS``."""
    return get_fused_config_from_dir(REPO_ROOT, parse_config_args(list(args)))


def test_pyproject_declares_the_typed_keys_and_overrides_each_unset():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"
    ]
    assert declared == {**dict.fromkeys(RUN_CONFIG_KEYS, ""), "overrides": ""}


def test_typed_keys_compose_as_fedsim_runs_overrides(tmp_path):
    given = fused(
        f"experiment='fedtp_paper' hardware='gpu_1' seed=3 num-server-rounds=2 "
        f"privacy='none' strategy='dp_mean' overrides='protocol.alpha=0.5 results_dir={tmp_path}'"
    )
    assert config_from_run(given) == compose(
        [
            "experiment=fedtp_paper",
            "hardware=gpu_1",
            "seed=3",
            "num_rounds=2",
            "privacy=none",
            "strategy=dp_mean",
            "protocol.alpha=0.5",
            f"results_dir={tmp_path}",
        ]
    )
    assert config_from_run(fused("seed=3 overrides='seed=4'")).seed == 4  # `overrides` comes last


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_a_preset_is_declared_keys_and_composes(preset):
    keys = tomllib.loads(preset.read_text())
    cfg = config_from_run(fused(str(preset)))
    assert cfg.protocol.name == compose([f"experiment={keys['experiment']}"]).protocol.name


@pytest.mark.parametrize(
    ("run_config", "message"),
    [
        ("seed='x'", "could not be converted to Integer"),
        ("num-server-rounds=0", "num_rounds"),
        (
            "experiment='fedtpp'",
            "'fedtpp' is not a experiment; valid choices: clock_fedbuff_sync, clock_feddtre_stragglers,",
        ),
        ("hardware='gpu'", "valid choices: cpu_2, deploy_local, deploy_remote, gpu_1"),
        ("overrides='num_round=3'", "Did you mean: num_rounds"),
    ],
)
def test_a_wrong_value_is_refused_with_fedsims_message(run_config, message):
    with pytest.raises(REFUSED, match=message):
        config_from_run(fused(run_config))


def test_an_undeclared_key_is_refused_by_flower():
    with pytest.raises(ValueError, match="'num_round' is not present"):
        fused("num_round=3")


class Nodes:
    def __init__(self, count: int):
        self.count = count

    def get_node_ids(self):
        return range(1, self.count + 1)


@pytest.mark.parametrize(
    ("nodes", "extra", "said"),
    [
        (
            2,
            [],
            "2 SuperNodes connected for the task's 20 clients: each SuperNode hosts about 10 of them and "
            "answers for them in one reply; for one client per SuperNode use "
            "--federation-config \"num-supernodes=20\"",
        ),
        (20, [], "20 SuperNodes connected for 20 clients, one client per SuperNode"),
        (
            2,
            ["hardware.clients_per_supernode=10"],
            "2 SuperNodes connected, 20 logical clients (up to 10 per "
            "SuperNode), one reply per client",
        ),
    ],
)
def test_the_serverapp_states_how_the_clients_sit_on_the_supernodes(
    nodes, extra, said, caplog, monkeypatch
):
    cfg = compose([*SMALL, *extra])  # hardware.num_clients null, as under flwr run: the task's 20
    monkeypatch.setattr(
        logging.getLogger("fedsim"), "propagate", True
    )  # the ServerApp's own handler may be set
    with caplog.at_level(logging.INFO, logger="fedsim"):
        state_layout(Nodes(nodes), cfg)
    assert said in caplog.text and cfg.hardware.num_clients == 20


def test_federations_writes_connections_flower_reads_sized_for_the_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert cli.main(["federations", *SMALL]) == 0
    for name, profile in cli.FEDERATIONS.items():
        options = read_superlink_connection(name).options
        hw = compose([f"hardware={profile}"]).hardware
        assert read_superlink_connection(name).address == ":local:" and options.num_supernodes == 20
        assert (
            options.backend.client_resources.num_cpus,
            options.backend.client_resources.num_gpus,
            options.backend.init_args.num_cpus,
        ) == (hw.client_cpus, hw.client_gpus, hw.num_cpus)
        sent = _parse_federation_config_overrides(
            None, read_superlink_connection(name)
        )  # what `flwr run` sends
        assert (sent.num_supernodes, sent.client_resources_num_gpus) == (20, hw.client_gpus)
    assert "`flwr run . gpu-simulation`: 20 SuperNodes for 20 clients" in capsys.readouterr().out
    assert read_superlink_connection("local").address == ":local:"  # Flower's own default kept
    assert cli.main(["federations", "experiment=fedtpp"]) == 2


def test_a_run_joins_the_ray_cluster_it_names_and_no_other():
    """Flower's simulation process takes Ray's cluster from ``RAY_ADDRESS`` (its federation config
    carries no address): ``hardware.ray_address`` sets it, sized without Ray's CPUs (Ray refuses
    them from a driver joining a cluster), and a run on its own Ray drops a shell's RAY_ADDRESS,
    which would have sent it to that cluster."""
    own = compose([]).hardware
    cluster = compose(["hardware=ray_cluster", "hardware.ray_address=head:6379"]).hardware
    shell = {"RAY_ADDRESS": "elsewhere:6379", "PATH": "/bin"}
    assert simulation_env(shell, own) == {"PATH": "/bin"}
    assert simulation_env(shell, cluster) == {"RAY_ADDRESS": "head:6379", "PATH": "/bin"}
    local = SuperLinkConnection("local", address=":local:")
    for hw, init_args in ((own, {"num_cpus": own.num_cpus}), (cluster, {})):
        sent = _parse_federation_config_overrides([federation_config(hw, 4)], local)
        backend = _run_simulation_settings(sent)[
            2
        ]  # what Flower's simulation process gives RayBackend
        assert backend == {
            "client_resources": {"num_cpus": hw.client_cpus, "num_gpus": hw.client_gpus},
            "init_args": init_args,
        }
