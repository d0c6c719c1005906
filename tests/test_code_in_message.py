"""The server chooses what a client computes, not which code runs on the client's machine. Every
message carries the task config, and the ClientApp builds what it names: the handler class
(``task.client``), a partitioner's, an evaluator's or a selector's spec, a dataset's loader. So
a message is held to the allow-list a config is held to (``fedsim/code_policy.py``): code outside
fedsim's packages and Flower's strategy and partitioner namespaces gets an error reply, and the
client builds nothing and never imports it."""

import ast
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from conftest import Unpickled
from fedsim.code_policy import CODE_NAMESPACES
from fedsim.runtime import client_app
from fedsim.runtime.inprocess_grid import InProcessGrid

REPO = Path(__file__).resolve().parents[1]
ALLOWED = ", ".join(CODE_NAMESPACES)


def reply_to(task: dict) -> Message:
    """The reply of the real ClientApp (its mods, the per-message seeding) to a discovery message
    carrying ``task``, over Flower's wire format: what a server's message gets from partition 0."""
    context = Context(
        run_id=1,
        node_id=1,
        state=RecordDict(),
        run_config={},
        node_config={"partition-id": 0, "num-partitions": 1},
    )
    grid = InProcessGrid({1: lambda msg: client_app.app(msg, context).content})
    config = ConfigRecord({client_app.TASK_KEY: json.dumps({"data_root": None, **task})})
    [reply] = grid.send_and_receive(
        [grid.create_message(RecordDict({"config": config}), MessageType.QUERY, 1, "")]
    )
    return reply


def refused(reply: Message, key: str, target: str) -> bool:
    return reply.has_error() and f"{key}: '{target}' is outside" in reply.error.reason


@pytest.fixture
def unpickles(tmp_path):
    """A ``numpy.load`` spec on a planted ``.npy`` whose unpickling creates a file: the spec, the file."""
    marker, weights = tmp_path / "code-ran", tmp_path / "weights.npy"
    np.save(weights, np.array([Unpickled(marker)], dtype=object), allow_pickle=True)
    return {"_target_": "numpy.load", "file": str(weights), "allow_pickle": True}, marker


@pytest.mark.parametrize("target", ["subprocess.Popen", "os.system", "builtins.eval"])
def test_a_client_class_outside_fedsim_gets_an_error_reply(target):
    reply = reply_to({"client": target})
    assert refused(reply, "task.client", target) and ALLOWED in reply.error.reason, reply


def test_a_client_class_in_a_planted_module_is_never_imported(planted):
    target, marker = planted
    assert refused(reply_to({"client": target}), "task.client", target)
    assert not marker.exists() and target.split(".")[0] not in sys.modules


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (
            "fedsim_clients.handler.os.system",
            "defined in posix",
        ),  # reached through a module's import
        ("fedsim_clients.dialogue.round_lr", "is not a class"),  # fedsim's, but a function
        ("fedsim.privacy.secret.create_private_file", "is outside"),  # fedsim's core: machinery
    ],
)
def test_a_client_class_must_be_a_class_defined_in_fedsim(target, why):
    reply = reply_to({"client": target})
    assert (
        reply.has_error()
        and f"task.client: '{target}'" in reply.error.reason
        and why in reply.error.reason
    )


def created(spec: dict) -> str:
    """``spec`` as an interpolation that resolves to it (OmegaConf's ``oc.create``)."""
    return "${oc.create:{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in spec.items()) + "}}"


RETRIEVER = {
    "client": "fedsim_clients.retriever.RetrieverClient",
    "companies": [],
}  # builds its partitioner first
# where a spec's code sits: the partitioner given the spec, the key the refusal names
NESTINGS = {
    "the partitioner": (lambda spec: spec, "task.partitioner._target_"),
    "an argument": (
        lambda spec: {
            "_target_": "flwr_datasets.partitioner.IidPartitioner",
            "num_partitions": spec,
        },
        "task.partitioner.num_partitions._target_",
    ),
    "a positional argument": (
        lambda spec: {"_target_": "flwr_datasets.partitioner.IidPartitioner", "_args_": [spec]},
        "task.partitioner._args_[0]._target_",
    ),
    "an interpolation": (
        lambda spec: {
            "_target_": "flwr_datasets.partitioner.IidPartitioner",
            "num_partitions": created(spec),
        },
        "task.partitioner.num_partitions._target_",
    ),
}


@pytest.mark.parametrize("nesting", NESTINGS)
def test_a_partitioner_spec_naming_code_outside_fedsim_builds_nothing(unpickles, nesting):
    spec, marker = unpickles
    partitioner, key = NESTINGS[nesting]
    reply = reply_to({**RETRIEVER, "partitioner": partitioner(spec)})
    assert refused(reply, key, "numpy.load") and not marker.exists(), reply


def test_a_partitioner_reached_through_a_fedsim_module_builds_nothing(unpickles):
    spec, marker = unpickles
    target = "fedsim_strategies.dp_mean.np.load"
    reply = reply_to({**RETRIEVER, "partitioner": {**spec, "_target_": target}})
    assert reply.has_error() and f"task.partitioner._target_: '{target}'" in reply.error.reason
    assert "defined in numpy" in reply.error.reason and not marker.exists()


def test_an_evaluator_or_selector_spec_naming_code_outside_fedsim_builds_nothing(unpickles):
    """The trust evaluator (FedDTRE) and the selector (FedBiscuit) a message names, built once
    per process where a message asks for them."""
    from fedsim_clients.dialogue import _evaluator
    from fedsim_clients.preference import _selector

    spec, marker = unpickles
    nested = {"_target_": "fedsim_tasks.hh_preference.selector.TfidfScorer", "human_words": spec}
    for build, key in ((_evaluator, "task.evaluator"), (_selector, "task.selector")):
        for named, where in ((spec, f"{key}._target_"), (nested, f"{key}.human_words._target_")):
            with pytest.raises(ValueError, match=rf"{where}: 'numpy.load' is outside"):
                build(json.dumps(named), 0)
    assert not marker.exists()


def test_a_seed_the_message_gives_a_selector_builds_nothing(unpickles):
    """The message's seed is an argument of the selector Hydra builds: a spec there is built too."""
    from fedsim_clients.preference import PreferenceClient

    spec, marker = unpickles
    for seed in (spec, created(spec)):
        client = PreferenceClient.__new__(PreferenceClient)  # its data is not what is attacked
        client.task = {
            "selector": {"_target_": "fedsim_tasks.hh_preference.selector.TfidfScorer"},
            "seed": seed,
        }
        with pytest.raises(
            ValueError, match=r"task\.selector\.seed\._target_: 'numpy.load' is outside"
        ):
            client.initial_selector  # noqa: B018 - the property builds the selector
    assert not marker.exists()


def test_a_dataset_loader_outside_fedsim_is_never_imported(planted, tmp_path):
    from fedsim_tasks.dialogue.dataset import DialogueTask

    target, marker = planted
    hop = "fedsim_tasks.causal_lm.os.system"  # reached through a module's import
    for loader, why in ((target, "is outside"), (hop, r"is outside .*\(defined in posix\)")):
        with pytest.raises(
            ValueError, match=rf"task\.datasets\.spc\.loader: '{re.escape(loader)}' {why}"
        ):
            DialogueTask("spc", {"loader": loader, "train_split": "train"}, {}, str(tmp_path))
    assert not marker.exists() and target.split(".")[0] not in sys.modules


# Hydra's resolvers of a dotted name, and Python's own
RESOLVERS = {
    "instantiate",
    "call",
    "get_class",
    "get_method",
    "get_object",
    "_locate",
    "import_module",
    "__import__",
}


def test_client_side_code_resolves_names_only_through_the_allow_list():
    """The runtime, privacy's client half, the clients and the tasks they build call none of
    Hydra's or Python's resolvers of a dotted name themselves: every name a message carries goes
    through ``fedsim.code_policy``, so a new call site cannot skip it."""
    found = []
    for package in ("fedsim/runtime", "fedsim/privacy", "fedsim_clients", "fedsim_tasks"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name.startswith(("test_", "conftest")):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.ImportFrom)
                    else [node.func.id]
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    else []
                )
                found += [
                    f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n in RESOLVERS
                ]
    assert not found, "resolves a name outside fedsim.code_policy:\n" + "\n".join(found)
