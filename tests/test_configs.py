"""Every experiment config composes and passes its protocol schema (the paper-scale ones too,
which cannot run here), and every value is written once: in conf/, never as a schema default."""

import copy
import dataclasses
import functools
import re
import typing
from pathlib import Path

import omegaconf
import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf, open_dict

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.config.schema import RunConfig, check

EXPERIMENTS = sorted(
    p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml")
)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_fits_its_schema(experiment):
    cfg = compose([f"experiment={experiment}"])
    protocol = check(cfg)
    assert protocol.name == cfg.protocol.name
    assert cfg.sweep.metrics, (
        f"{experiment} names no headline metrics (sweep.metrics)"
    )  # the summary leads with them


def test_a_preset_turns_off_datasets_and_methods_with_null():
    """feddtre_seeds keeps Synthetic-Persona-Chat and three methods; what it sets to null is
    neither loaded nor run, and the base generator's seed is fixed for every run seed."""
    from fedsim_experiments.feddtre.protocol import check as feddtre_check
    from fedsim_tasks.dialogue.dataset import load_tasks

    cfg = compose(
        [
            "experiment=feddtre_seeds",
            data_root_override(),
            "task.max_conversations=20",
            "task.num_clients=2",
            "task.datasets.persona_chat.partitioner.group_size=10",
            "protocol.clients_per_round=2",
            "protocol.evaluator.clients_per_round=2",
        ]
    )
    task = OmegaConf.to_container(cfg.task, resolve=True)
    assert list(load_tasks(task, task["data_root"])) == ["persona_chat"]
    protocol = feddtre_check(cfg)
    assert [m for m, spec in protocol.methods.items() if spec is not None] == [
        "base",
        "fedavg",
        "fixed_alpha_0p5",
        "feddtre",
    ]
    assert protocol.generator.base_seed == 0


def test_a_method_name_with_a_dot_is_refused_before_the_run():
    """A dotted name would split its results path (methods.<name>.<dataset>) and its overrides."""
    from fedsim_experiments.feddtre.protocol import check as feddtre_check

    cfg = compose(["experiment=feddtre_seeds"])
    with open_dict(cfg):
        cfg.protocol.methods["fixed_alpha_0.5"] = cfg.protocol.methods.fixed_alpha_0p5
    with pytest.raises(ValueError, match="contain '.'"):
        feddtre_check(cfg)


def test_dp_sgd_refuses_fedprox_in_the_slot_as_in_a_method():
    """FedProx's proximal term escapes DP-SGD's per-record clipping, by override or by method."""
    cfg = compose(
        [
            "experiment=feddtre_paper",
            "strategy=fedprox",
            "protocol.generator.dp_sgd.enabled=true",
            "protocol.generator.dp_sgd.noise_multiplier=1.0",
            "~protocol.methods.fedprox",
        ]
    )
    with pytest.raises(ValueError, match=r"methods \['fedavg'\] would escape it"):
        check(cfg)
    check(
        compose(
            [
                "experiment=feddtre_paper",
                "protocol.generator.dp_sgd.enabled=true",
                "protocol.generator.dp_sgd.noise_multiplier=1.0",
                "~protocol.methods.fedprox",
            ]
        )
    )


def _with_nested(classes: set[type]) -> set[type]:
    """``classes`` and every dataclass their fields hold, however deep."""
    nested = {
        kind
        for cls in classes
        for kind in typing.get_type_hints(cls).values()
        if dataclasses.is_dataclass(kind)
    }
    return classes if nested <= classes else _with_nested(classes | nested)


def test_no_schema_field_carries_a_default():
    """A default in a dataclass would be a second copy of the YAML's value, free to drift from
    it. Core structured configs hold only MISSING (Hydra's "no value yet"); protocol and task
    dataclasses (every one an experiment names, with what they nest) hold nothing."""
    core = _with_nested({RunConfig})
    blocks = [compose([f"experiment={e}"]) for e in EXPERIMENTS]
    protocols = _with_nested(
        {*(get_class(cfg[block].schema) for cfg in blocks for block in ("protocol", "task"))}
    )
    allowed = {cls: {omegaconf.MISSING} if cls in core else set() for cls in core | protocols}
    defaults = [
        f"{cls.__module__}.{cls.__qualname__}.{f.name} = {f.default!r}"
        for cls in allowed
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
        or f.default not in {dataclasses.MISSING, *allowed[cls]}
    ]
    assert not defaults, "defaults belong in conf/*.yaml: " + "; ".join(sorted(defaults))
    assert {
        "FedDTREProtocol",
        "Generator",
        "DPSGD",
        "RLHF",
        "StrategySlot",
        "Waits",
        "DialogueSettings",
        "PseudoQueries",
    } <= {cls.__name__ for cls in allowed}  # the walk reaches nested blocks


WRONG = {
    int: ["x", 1.5, True],
    float: ["x", [1.0]],
    bool: ["x", [True]],
    str: [[1], {"a": 1}],
    list: ["x", 0.5],
    dict: ["x", 3],
}
"""Values of another type than each key's (an int key given a word, a fraction or a bool; a list
key given a scalar...). OmegaConf converts an int to a bool, and a number to a str, so those are
not wrong here."""


def typed_keys(schema, prefix: str):
    """(dotted key, declared type) of every key a typed block's dataclass declares, nested ones too."""
    for name, kind in typing.get_type_hints(schema).items():
        options = [o for o in typing.get_args(kind) if o is not type(None)] or [kind]
        inner = typing.get_origin(options[0]) or options[0]
        if dataclasses.is_dataclass(inner):
            yield from typed_keys(inner, f"{prefix}{name}.")
        elif inner in WRONG:
            yield f"{prefix}{name}", inner


@functools.cache
def composed(experiment: str):
    return compose([f"experiment={experiment}"])


def wrong_values(experiments):
    """One key per (block, declared type) and experiment family, each with every wrong value of
    its type: what a user mistypes, across every kind of key the schemas declare."""
    seen = set()
    for experiment in experiments:
        cfg = composed(experiment)
        for block in ("task", "protocol"):
            for key, kind in typed_keys(get_class(cfg[block].schema), f"{block}."):
                if (block, kind, experiment) not in seen and OmegaConf.select(
                    cfg, key, default=None
                ) is not None:
                    seen.add((block, kind, experiment))
                    yield from ((experiment, key, value) for value in WRONG[kind])


FAMILIES = ["fedtp_paper", "fede4rag_paper", "fedbiscuit_paper", "feddtre_paper"]


@pytest.mark.parametrize("experiment, key, value", list(wrong_values(FAMILIES)))
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(experiment, key, value):
    """Every task and protocol key is typed by its block's dataclass: a wrong type is refused by
    the pre-run check, naming the key (not met minutes later by the code that reads it)."""
    cfg = copy.deepcopy(composed(experiment))
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ValueError, match=re.escape(key)):
        check(cfg)


def test_the_experiment_digest_follows_the_experiment_not_where_it_runs():
    """What a journal is bound to (a resume refuses another): the experiment's keys, not the keys
    a resume may change (hardware, timeouts, the data's location, sinks)."""
    from fedsim.config.compose import compose, experiment_digest

    base = experiment_digest(compose())
    assert (
        experiment_digest(compose(["hardware.num_cpus=7", "round_timeout=99", "logging.csv=false"]))
        == base
    )
    assert experiment_digest(compose(["protocol.alpha=0.9"])) != base
    assert experiment_digest(compose(["seed=3"])) != base
