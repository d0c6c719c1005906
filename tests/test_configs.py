"""Every experiment config composes and passes its protocol schema (the paper-scale ones too,
which cannot run here)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from fedsim.config import compose
from fedsim.schema import check

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_fits_its_schema(experiment):
    cfg = compose([f"experiment={experiment}"])
    protocol = check(cfg)
    assert protocol.name == cfg.protocol.name


def test_a_preset_turns_off_datasets_and_methods_with_null():
    """feddtre_seeds keeps Synthetic-Persona-Chat and three methods; what it sets to null is
    neither loaded nor run, and the base generator's seed is fixed for every run seed."""
    from experiments.feddtre import check as feddtre_check
    from tasks.dialogue.dataset import load_tasks

    cfg = compose(["experiment=feddtre_seeds", "data_root=../shared/data", "task.max_conversations=20",
                   "task.num_clients=2", "task.datasets.persona_chat.partitioner.group_size=10"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    assert list(load_tasks(task, task["data_root"])) == ["persona_chat"]
    protocol = feddtre_check(cfg)
    assert [m for m, spec in protocol.methods.items() if spec is not None] == ["base", "fedavg", "fixed_alpha_0p5",
                                                                             "feddtre"]
    assert protocol.generator.base_seed == 0


def test_a_method_name_with_a_dot_is_refused_before_the_run():
    """A dotted name would split its results path (methods.<name>.<dataset>) and its overrides."""
    from experiments.feddtre import check as feddtre_check

    cfg = compose(["experiment=feddtre_seeds"])
    with open_dict(cfg):
        cfg.protocol.methods["fixed_alpha_0.5"] = cfg.protocol.methods.fixed_alpha_0p5
    with pytest.raises(ValueError, match="contain '.'"):
        feddtre_check(cfg)


def test_dp_sgd_refuses_fedprox_in_the_slot_as_in_a_method():
    """FedProx's proximal term escapes DP-SGD's per-record clipping, by override or by method."""
    cfg = compose(["experiment=feddtre_paper", "strategy=fedprox", "protocol.generator.dp_sgd.enabled=true",
                   "protocol.generator.dp_sgd.noise_multiplier=1.0", "~protocol.methods.fedprox"])
    with pytest.raises(ValueError, match=r"methods \['fedavg'\] would escape it"):
        check(cfg)
    check(compose(["experiment=feddtre_paper", "protocol.generator.dp_sgd.enabled=true",
                   "protocol.generator.dp_sgd.noise_multiplier=1.0", "~protocol.methods.fedprox"]))
