"""The code a config or a message may name, and the one way to resolve it.

A run config is input (a resume's saved overrides; under ``flwr run``, whoever submits it), and
so is every message a client receives: the server sends the task config, and the client builds
what it names (``task.client``; a partitioner's, an evaluator's or a selector's spec; a
dataset's loader). Only fedsim's own packages and the Flower namespaces conf/ uses may be named:
first by the dotted name, before anything is imported (``numpy.load``, a planted module), then
by what it resolves to, once fedsim's and Flower's own modules are imported: code defined there
(not ``fedsim.privacy.secret.os.system``, posix's) of the kind its key takes (a class for a
``_target_``, not one of fedsim's functions). By hand: Hydra's own target policy is a blocklist
(``numpy.load`` passes it), applied by ``instantiate`` alone, after the import, and not by
``get_class`` (``subprocess.Popen`` passes it)."""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

# fedsim's packages of strategies, tasks, clients and experiments, the Flower namespaces conf/
# uses, and of fedsim's core its Protocol schema alone: the core is machinery (its launcher's
# Process runs any command, a fresh Journal empties its folder)
CODE_NAMESPACES = (
    "fedsim.config.schema.Protocol",
    "fedsim_strategies",
    "fedsim_tasks",
    "fedsim_clients",
    "fedsim_experiments",
    "flwr.serverapp.strategy",
    "flwr_datasets.partitioner",
)
# each key that names code -> what it must name: a class to build (or a block's schema), a function to call
CODE_KEYS = {
    "_target_": "class",
    "schema": "class",
    "client": "class",
    "run": "function",
    "loader": "function",
}
ALLOWED = f"a config may name code in {', '.join(CODE_NAMESPACES)} only"


def named_code(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every (key, dotted path) under a key of :data:`CODE_KEYS` inside ``value`` (dicts and
    lists, as JSON or ``OmegaConf.to_container`` give them), ``key`` naming where ``value`` sits."""
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for name, inner in items:
        where = (
            f"{key}[{name}]" if isinstance(value, list) else f"{key}.{name}" if key else str(name)
        )
        if name in CODE_KEYS and isinstance(inner, str):
            yield where, inner
        else:
            yield from named_code(inner, where)


def refuse_by_name(named: Iterable[tuple[str, str]]) -> None:
    """Refuse any (key, path) whose path lies outside :data:`CODE_NAMESPACES`; nothing is imported."""
    for key, path in named:
        if not _in_namespaces(path):
            raise ValueError(
                f"{key}: {path!r} is outside fedsim and Flower's strategies; {ALLOWED}"
            )


def refuse_by_definition(key: str, path: str, found: Any) -> None:
    """Refuse what ``path`` resolved to (``found``) unless it is defined in :data:`CODE_NAMESPACES`
    (by module and qualified name) and is of the kind ``key`` takes (:data:`CODE_KEYS`, by ``key``'s last part)."""
    home = (
        found.__name__
        if isinstance(found, types.ModuleType)
        else getattr(found, "__module__", None)
    )
    defined = (
        home
        if isinstance(found, types.ModuleType)
        else f"{home}.{getattr(found, '__qualname__', '')}"
    )
    if not _in_namespaces(str(defined)):
        raise ValueError(
            f"{key}: {path!r} is outside fedsim and Flower's strategies (defined in {home}); {ALLOWED}"
        )
    kind = CODE_KEYS[key.rsplit(".", 1)[-1]]
    if isinstance(found, type) != (kind == "class") or not callable(found):
        raise ValueError(f"{key}: {path!r} is not a {kind}")


def allowed_code(path: str, key: str) -> Any:
    """The class or function ``path`` names under ``key`` (``task.client``, ``task.datasets.x.loader``),
    once it passed both checks: refused by name before it is imported."""
    refuse_by_name([(key, path)])
    found = get_object(path)
    refuse_by_definition(key, path, found)
    return found


def instantiate_allowed(spec: dict | DictConfig, key: str, /, **kwargs) -> Any:
    """Hydra's ``instantiate(spec, **kwargs)`` once every ``_target_`` in what it would build
    passed both checks: ``spec`` merged with ``kwargs`` and its interpolations resolved, as
    ``instantiate`` does (a message's seed or an ``oc.create`` can hold a spec too). ``key``
    names where ``spec`` sits (``task.partitioner``)."""
    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    config = OmegaConf.merge(OmegaConf.create(spec, flags={"allow_objects": True}), kwargs)
    OmegaConf.resolve(config)
    named = list(named_code(OmegaConf.to_container(config), key))
    refuse_by_name(named)
    for where, path in named:
        refuse_by_definition(where, path, get_object(path))
    return instantiate(config)


def _in_namespaces(path: str) -> bool:
    return any(path == space or path.startswith(f"{space}.") for space in CODE_NAMESPACES)
