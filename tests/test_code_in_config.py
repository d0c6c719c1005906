"""A config names code (every ``_target_``, a block's ``schema``, ``task.client``,
``protocol.run``, a dataset's ``loader``), and the run config is input: a resume's saved
overrides, or under ``flwr run`` whoever submits it. Only fedsim's packages of methods and
tasks (of its core, the Protocol schema alone) and Flower's strategy and partitioner namespaces
may be named; anything else is refused before it is imported (exit 2, naming the key), on both
paths, wherever in the tree it sits."""

import logging
import re
import sys
import time
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from conftest import fedsim_refusal
from fedsim.code_policy import CODE_NAMESPACES
from fedsim.config.compose import REFUSED, compose
from fedsim.config.schema import check_code
from fedsim.privacy.secret import private_folder
from fedsim.runtime import server_app

OUTSIDE = ["numpy.load", "os.system", "pickle.loads", "builtins.eval"]
# where a target sits: the overrides that put it there, the key the refusal names
PLACES = {
    "strategy": (["strategy._target_={}"], "strategy._target_"),
    "nested in the strategy": (["+strategy.inner={{_target_: {}}}"], "strategy.inner._target_"),
    "privacy wrapper": (
        ["privacy=dp_server_fixed", "privacy.wrapper._target_={}"],
        "privacy.wrapper._target_",
    ),
    "task partitioner": (
        ["experiment=fedbiscuit_paper", "task.partitioner._target_={}"],
        "task.partitioner._target_",
    ),
    "deep in a method": (
        ["experiment=feddtre_paper", "protocol.methods.fedprox.strategy._target_={}"],
        "protocol.methods.fedprox.strategy._target_",
    ),
    "task.client": (["task.client={}"], "task.client"),
    "protocol.run": (["protocol.run={}"], "protocol.run"),
    "protocol.schema": (["protocol.schema={}"], "protocol.schema"),
}


def allowed_in(log: str) -> bool:
    return ", ".join(CODE_NAMESPACES) in log


@pytest.mark.parametrize("target", OUTSIDE)
@pytest.mark.parametrize("place", PLACES)
def test_code_outside_fedsim_and_flower_is_refused_wherever_it_is_named(place, target):
    overrides, key = PLACES[place]
    code, log = fedsim_refusal(*(o.format(target) for o in overrides))
    assert code == 2 and f"{key}: '{target}'" in log and allowed_in(log), log


@pytest.mark.parametrize(
    "place", ["strategy", "nested in the strategy", "task.client", "protocol.schema"]
)
def test_a_refused_module_is_never_imported(planted, place):
    target, marker = planted
    overrides, key = PLACES[place]
    code, log = fedsim_refusal(*(o.format(target) for o in overrides))
    assert code == 2 and f"{key}: '{target}'" in log, log
    assert not marker.exists() and target.split(".")[0] not in sys.modules


def test_the_server_app_refuses_what_flwr_runs_config_names(planted, monkeypatch, capsys):
    """``flwr run --run-config "overrides='...'"``: the ServerApp's own composition refuses it
    before it sends anything (its grid, None here, is never used)."""
    target, marker = planted
    logger = logging.getLogger("fedsim")
    for name in (
        "handlers",
        "propagate",
        "level",
    ):  # the ServerApp sets up its logger: undone after
        monkeypatch.setattr(
            logger, name, list(logger.handlers) if name == "handlers" else getattr(logger, name)
        )
    for overrides in (
        f"strategy._target_={target}",
        "strategy._target_=numpy.load",
        "'+strategy.inner={_target_: os.system, command: id}'",
    ):
        with pytest.raises(REFUSED, match=r"strategy(\.inner)?\._target_: '.*' is outside"):
            server_app.main(None, SimpleNamespace(run_id=1, run_config={"overrides": overrides}))
    assert not marker.exists() and target.split(".")[0] not in sys.modules
    assert "configuration error, nothing was sent" in capsys.readouterr().err


# turn_sentiment_fedavg lets a strategy through that any experiment of Flower's strategies takes
UNGUARDED = [
    "experiment=turn_sentiment_fedavg",
    "hardware.num_clients=2",
    *(
        f"~strategy.{k}"
        for k in ("fraction_train", "fraction_evaluate", "min_train_nodes", "min_available_nodes")
    ),
]


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (
            "fedsim_clients.handler.os.system",
            "defined in posix",
        ),  # reached through a module's import
        ("fedsim_strategies.dp_mean.np.load", "defined in numpy"),
        (
            "fedsim_experiments.fedtp.protocol.RunOutput",
            "defined in fedsim.results.outputs",
        ),  # fedsim's core, imported
        ("fedsim_tasks.causal_lm.prepare_base", "not a class"),  # fedsim's, but a function
    ],
)
def test_a_name_inside_fedsim_must_be_code_defined_there_of_the_kind_its_key_takes(
    tmp_path, target, why
):
    marker = tmp_path / "code-ran"
    code, log = fedsim_refusal(
        *UNGUARDED, f"strategy._target_={target}", f"+strategy.command='touch {marker}'"
    )
    assert code == 2 and f"strategy._target_: '{target}'" in log and why in log, log
    assert not marker.exists()


@pytest.mark.parametrize(
    "target", ["fedsim.run.launcher.Process", "fedsim.runtime.journal.Journal"]
)
def test_fedsims_own_machinery_is_not_code_a_config_may_build(tmp_path, target):
    """fedsim's core (the launcher, the journal, the secrets) is no strategy, partitioner or task:
    built with a config's arguments, its launcher's Process ran any command and a fresh Journal
    emptied any folder of this user's, both in the pre-run check. Only its Protocol schema may be
    named."""
    victim = private_folder(tmp_path / "victim")
    (victim / "keep").write_text("mine")
    marker = tmp_path / "code-ran"
    arguments = {
        "fedsim.run.launcher.Process": [
            f"+strategy.cmd=[/bin/sh,-c,'touch {marker}']",
            f"+strategy.cwd={tmp_path}",
            "+strategy.env={}",
            f"+strategy.log={tmp_path}/log",
        ],
        "fedsim.runtime.journal.Journal": [
            f"+strategy.folder={victim}",
            "+strategy.resume=false",
            "+strategy.key=k",
        ],
    }[target]
    code, log = fedsim_refusal(*UNGUARDED, f"strategy._target_={target}", *arguments)
    time.sleep(0.5)  # a command the check started would have run by now
    assert code == 2 and f"strategy._target_: '{target}' is outside" in log and allowed_in(log), log
    assert not marker.exists() and (victim / "keep").exists()


@pytest.mark.parametrize(
    ("strategy", "refused"),
    [
        (
            {"_target_": " os.system"},
            "strategy._target_: ' os.system' is outside",
        ),  # spelled to slip a prefix check
        (
            {"_target_": ".fedsim_strategies.dp_mean.np.load"},
            "'.fedsim_strategies.dp_mean.np.load' is outside",
        ),
        (
            {
                "_target_": "fedsim_strategies.dp_mean.DPMean",
                "inner": {
                    "_target_": "hydra.utils.get_method",
                    "_partial_": True,
                    "path": "os.system",
                },
            },
            "strategy.inner._target_: 'hydra.utils.get_method' is outside",
        ),
        (
            {
                "_target_": "fedsim_strategies.dp_mean.DPMean",
                "_args_": [[{"_target_": "os.system", "command": "id"}]],
            },
            "strategy._args_[0][0]._target_: 'os.system' is outside",
        ),
        (
            {
                "_target_": "fedsim_strategies.dp_mean.DPMean",
                "inner": "${oc.decode:'{_target_: os.system, command: id}'}",
            },
            "strategy.inner._target_: 'os.system' is outside",
        ),  # a target an interpolation builds
        (
            {"_target_": "${strategy.x}", "x": "os.system"},
            "strategy._target_: 'os.system' is outside",
        ),
        ({"_target_": "fedsim_strategies.dp_mean.DPMean.__init__.__globals__"}, "defined in None"),
    ],
)
def test_a_target_spelled_or_built_to_slip_past_the_allow_list_is_refused(strategy, refused):
    """The check reads the resolved tree, every key and list at any depth, by the name Hydra
    imports: no spelling, nesting or interpolation names code it does not see."""
    with pytest.raises(ValueError, match=re.escape(refused)):
        check_code(OmegaConf.create({"strategy": strategy}))


def test_every_config_of_conf_names_only_allowed_code():
    for experiment in (
        "fedtp",
        "fedbiscuit_paper",
        "feddtre_paper",
        "fede4rag_paper",
        "turn_sentiment_fedavg",
    ):
        for privacy in ("none", "dp_server_adaptive", "he_fedavg"):
            check_code(compose([f"experiment={experiment}", f"privacy={privacy}"]))
