"""Hydra's flags, as a Hydra user types them: ``--cfg job|hydra|all``, ``--info``, ``--version``;
nothing starts."""

from importlib.metadata import version

import pytest
from omegaconf import OmegaConf

from fedsim.run.cli import main


def run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cfg_hydra_and_all_print_hydras_node_with_the_overrides(capsys):
    code, out = run(capsys, "run", "--cfg", "hydra", "experiment=fedtp_paper", "seed=3")
    hydra = OmegaConf.create(out).hydra
    assert code == 0 and list(hydra.overrides.task) == ["experiment=fedtp_paper", "seed=3"]
    assert hydra.runtime.choices.experiment == "fedtp_paper"
    code, out = run(capsys, "run", "--cfg", "all", "seed=3")
    both = OmegaConf.create(out)
    assert code == 0 and both.seed == 3 and list(both.hydra.overrides.task) == ["seed=3"]


def test_info_names_where_the_config_comes_from_and_what_was_chosen(capsys):
    code, out = run(capsys, "run", "--info", "experiment=fede4rag_paper")
    assert code == 0
    assert "main: file://" in out and "/conf" in out  # the search path
    assert "  experiment: fede4rag_paper" in out and "  task: financebench_rag" in out
    assert "Overrides:\n  experiment=fede4rag_paper" in out


def test_info_refuses_what_a_run_would_refuse(capsys):
    assert main(["run", "--info", "num_rounds=0"]) == 2
    assert "num_rounds must be >= 1" in capsys.readouterr().err


def test_version_names_fedsim_flower_and_hydra(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"fedsim {version('fedsim')} (Flower {version('flwr')}, Hydra {version('hydra-core')})"
    )


def test_overrides_may_follow_a_flag(capsys):
    """``fedsim run --cfg job seed=3 KEY=V`` and ``fedsim run seed=3 --cfg job KEY=V`` are one
    command, as with Hydra's own apps; argparse alone refused the second ("unrecognized
    arguments": its overrides had matched before the flag), so a documented ``fedsim compare
    FOLDER --plan OVERRIDE`` failed. An unknown flag is still refused."""
    code, out = run(capsys, "run", "seed=3", "--cfg", "job", "num_rounds=2")
    assert code == 0 and OmegaConf.create(out).seed == 3 and OmegaConf.create(out).num_rounds == 2
    with pytest.raises(SystemExit) as refused:
        main(["run", "seed=3", "--cfg", "job", "--no-such-flag"])
    assert refused.value.code == 2 and "--no-such-flag" in capsys.readouterr().err
