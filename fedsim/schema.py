"""Typed schema of the run config, checked before any process starts.

The core keys are Hydra structured configs (a wrong type fails composition, naming the key);
every experiment's ``protocol`` block is checked against the frozen dataclass its
``protocol.schema`` names (a subclass of :class:`Protocol`: unknown keys, missing keys and wrong
types are refused), and ``protocol.run`` must name a callable. Every value, and each key's
one-line meaning, is written once, in the YAML files under ``conf/``; these classes give only
types (core keys ``MISSING``, protocol fields no default: a key the YAML lacks is an error, not
a second default here).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class, get_method, instantiate
from omegaconf import MISSING, DictConfig, OmegaConf


@dataclass
class Faults:
    """Fault injection into replies, by partition id (``fedsim/faults.py``; tests)."""
    crash: list[int] = MISSING          # these clients' ClientApp raises
    timeout: list[int] = MISSING        # these sleep timeout_seconds first
    nan: list[int] = MISSING            # these send NaN
    wrong_length: list[int] = MISSING   # these send one value short
    negative: list[int] = MISSING       # these send negative mass
    timeout_seconds: float = MISSING    # sleep of the timeout fault
    message_types: list[str] = MISSING  # replies affected


@dataclass
class Waits:
    """Flower's fixed waits on a deployment's message path, in seconds (``fedsim/flower_waits.py``);
    null keeps Flower's own."""
    superexec_poll: float | None = MISSING   # each SuperNode's SuperExec polls for tasks (Flower: 1.0)
    supernode_idle: float | None = MISSING   # a SuperNode's wait after a pull found no message (Flower: 3)
    supernode_reply: float | None = MISSING  # a SuperNode's poll for its ClientApp's reply (Flower: 0.5)
    pull_backoff: float | None = MISSING     # first retry of an object not uploaded yet (Flower: 1, doubling to 10)


@dataclass
class Hardware:
    """Where the run executes: Ray simulation resources or a deployment."""
    backend: str = MISSING                # simulation | deployment
    num_supernodes: int | None = MISSING  # null: ceil(num_clients / clients_per_supernode)
    num_clients: int | None = MISSING     # logical clients; null: num_supernodes x per node, else the population
    clients_per_supernode: int = MISSING  # logical clients a SuperNode hosts (at most); >1: one message per SuperNode
    num_cpus: int = MISSING               # CPUs Ray may use in all
    client_cpus: int = MISSING            # CPUs per ClientApp actor
    client_gpus: float = MISSING          # GPU share per ClientApp actor
    superlink: str | None = MISSING       # deployment: SuperLink address host:port
    launch_local: bool = MISSING          # deployment: start SuperLink + SuperNodes on loopback
    private_network: bool = MISSING       # simulation, launch_local: the run's processes in a network namespace
    insecure: bool = MISSING              # deployment: plain text, no node authentication (warns)
    certificates: str | None = MISSING    # deployment: folder with ca.pem (+ superlink / node keys)
    node_auth: bool = MISSING             # launch_local: SuperNodes authenticate with registered keys
    waits: Waits = MISSING                # deployment: Flower's polls shortened
    clientapp_preload: list[str] | None = MISSING  # libraries a warm process per SuperNode imports once


@dataclass
class Logging:
    """Per-exchange metric sinks under results_dir (``fedsim/sinks.py``)."""
    csv: bool = MISSING          # metrics.csv, one line per exchange and value
    tensorboard: bool = MISSING  # TensorBoard event files in results_dir/tensorboard
    mlflow: bool = MISSING       # the same metrics to an MLflow store, one MLflow run per run
    mlflow_dir: str = MISSING    # the MLflow store's folder (SQLite, <dir>/mlflow.db)


@dataclass
class ClientStateSettings:
    """Where clients keep state across rounds (``fedsim/client_state.py``)."""
    dir: str | None = MISSING      # node-local root; null: <tmp>/fedsim-clients (a SuperNode's state-dir wins)
    keep: bool = MISSING           # keep the run's client state after it completes
    run_key: str | None = MISSING  # set by the ServerApp, not by hand: the run's folder run-<key>


@dataclass
class Sweep:
    """How ``fedsim run -m`` / ``fedsim compare`` summarize a sweep (``fedsim/comparison.py``)."""
    seed_keys: list[str] = MISSING  # overrides that are replicates
    baseline: str | None = MISSING  # a method name inside results, or KEY=VALUE of a swept override
    metrics: list[str] = MISSING    # glob patterns of results.json paths; [] = every number
    interval: str = MISSING         # t (Student t over seeds) | bootstrap (scipy.stats.bootstrap, BCa)
    level: float = MISSING          # confidence level of every interval


@dataclass
class Privacy:
    """How private the run's DP releases are (``fedsim/privacy.py``), and the wrapper around the
    run's strategy (``conf/privacy/*.yaml``)."""
    reproducible_noise: bool = MISSING  # noise from the public seed: reproducible, not private
    kind: str = MISSING                 # none | dp (Flower's central DP wrappers) | he (HEFedAvg)
    wrapper: Any = MISSING              # the wrapper's _target_ and settings; null: none
    he: str | None = MISSING            # why this wrapper cannot run inside HE (null: it can)
    delta: float | None = MISSING       # delta of the (epsilon, delta) a dp wrapper's run reports


@dataclass
class RunConfig:
    task: Any = MISSING           # conf/task/*.yaml: data, client handler, metrics
    strategy: Any = MISSING       # conf/strategy/*.yaml: a Flower Strategy _target_
    hardware: Hardware = MISSING  # conf/hardware/*.yaml
    protocol: Any = MISSING       # conf/experiment/*.yaml: checked by its schema
    data_root: str | None = MISSING
    results_dir: str | None = MISSING
    seed: int = MISSING
    num_rounds: int = MISSING
    round_timeout: float = MISSING
    ship_results: bool = MISSING  # set by the launcher for a remote SuperLink
    checkpoint: bool = MISSING    # journal every exchange under results_dir/checkpoint
    resume: bool = MISSING        # set by `fedsim run resume=DIR`: replay the journal
    privacy: Privacy = MISSING
    logging: Logging = MISSING
    faults: Faults = MISSING
    sweep: Sweep = MISSING
    client_state: ClientStateSettings = MISSING


@dataclass(frozen=True, kw_only=True)
class StrategySlot:
    """Where an experiment runs the top-level ``strategy`` (and ``privacy``'s wrapper around it):
    what its clients' replies are and what it refuses, with why."""
    role: str                   # the methods / phases that run it
    accepts: list[str]          # reply contracts its clients speak (a strategy's traits.takes)
    refuses: dict[str, str]     # an aggregation or privacy kind -> why not here
    loss_key: str | None        # the metric its clients report their training loss under (QFedAvg)


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """Keys every experiment's ``protocol`` block has."""
    name: str    # results folder name
    run: str     # the server-side protocol function, run(messenger, cfg, out)
    schema: str  # this block's dataclass (a subclass of Protocol)
    strategy_slot: StrategySlot
    """where ``strategy=`` and ``privacy=`` act in this experiment"""

    def he_methods(self) -> list[str]:
        """The methods that run the strategy under HE whatever ``privacy`` says."""
        return []

    def refuses_strategy(self, settings: dict) -> str | None:
        """Why this protocol's own settings cannot run the slot's strategy (its constructor
        ``settings``), when that depends on more than the slot's fixed ``refuses``."""
        return None


ConfigStore.instance().store(name="fedsim_schema", node=RunConfig)

BACKENDS = ("simulation", "deployment")
MESSAGE_TYPES = ("train", "evaluate", "query")
INTERVALS = ("t", "bootstrap")


def _writable(schema: type) -> DictConfig:
    """``schema``'s node with every nested dataclass's node in place, none read-only, so the
    user's values can be merged into a frozen dataclass (the merge still checks every key and
    type; a key left without a value fails when the dataclass is built)."""
    node = OmegaConf.structured(schema)
    OmegaConf.set_readonly(node, False)
    for name, kind in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(kind):
            node[name] = _writable(kind)
    return node


def layout(hw, population: int) -> tuple[int, int]:
    """(logical clients N, SuperNodes K) of ``hardware``; client ``l`` runs on SuperNode
    ``l mod K`` (``fedsim/sharded_grid.py``). Refuses counts that leave a SuperNode empty or a
    client without one."""
    per = int(hw.clients_per_supernode)
    if per < 1:
        raise ValueError(f"hardware.clients_per_supernode must be >= 1, got {per}")
    clients = hw.num_clients or (hw.num_supernodes * per if hw.num_supernodes else population)
    supernodes = hw.num_supernodes or -(-clients // per)
    if clients < 1 or not supernodes <= clients <= supernodes * per:
        raise ValueError(f"hardware: {clients} clients do not fit {supernodes} SuperNodes x "
                         f"{per} clients_per_supernode (every SuperNode hosts 1..{per} clients)")
    return int(clients), int(supernodes)


def sweep_settings(*layers) -> DictConfig:
    """The ``sweep`` block from ``layers`` (dicts, configs, dot-lists' configs) merged onto its
    schema: a wrong key or type is refused, and so are a key no layer sets, an unknown interval or a
    level outside (0, 1)."""
    try:
        sweep = OmegaConf.merge(OmegaConf.structured(Sweep), *layers)
    except Exception as exc:
        raise ValueError(f"sweep: {exc}") from exc
    if unset := OmegaConf.missing_keys(sweep):
        raise ValueError(f"sweep: no value for {sorted(unset)}")
    if sweep.interval not in INTERVALS or not 0.0 < sweep.level < 1.0:
        raise ValueError(f"sweep.interval must be one of {INTERVALS} and 0 < sweep.level < 1, got "
                         f"{sweep.interval!r}, {sweep.level}")
    return sweep


def check(cfg: DictConfig) -> Protocol:
    """Refuse what composition cannot see: enums, callables, the protocol block's keys and
    types. Returns the protocol block as its dataclass."""
    if cfg.hardware.backend not in BACKENDS:
        raise ValueError(f"hardware.backend must be one of {BACKENDS}, got "
                         f"{cfg.hardware.backend!r}")
    hw = cfg.hardware
    if hw.backend == "deployment" and not (hw.launch_local or hw.superlink):
        raise ValueError("hardware.superlink (host:port) is required for a remote deployment")
    if hw.backend == "deployment" and not (hw.launch_local or hw.insecure or hw.certificates):
        raise ValueError("hardware.certificates (a folder with the federation's ca.pem) is "
                         "required for a remote SuperLink; hardware.insecure=true for plain text")
    if hw.backend == "deployment" and cfg.privacy.reproducible_noise:
        raise ValueError("privacy.reproducible_noise=true draws DP noise from the public seed "
                         "(not private): allowed in simulation only, refused for deployments")
    if cfg.logging.mlflow and hw.backend == "deployment" and not hw.launch_local:
        raise ValueError("logging.mlflow writes where the ServerApp runs: simulation or "
                         "hardware.launch_local only, refused for a remote SuperLink")
    if cfg.logging.mlflow and Path(cfg.logging.mlflow_dir).is_file():
        raise ValueError(f"logging.mlflow_dir={cfg.logging.mlflow_dir} is a file; the MLflow store is a folder")
    layout(hw, 1)  # the client / SuperNode counts fit (the population is checked by the CLI)
    bad = set(cfg.faults.message_types) - set(MESSAGE_TYPES)
    if bad:
        raise ValueError(f"faults.message_types: {sorted(bad)} not in {MESSAGE_TYPES}")
    sweep_settings(cfg.sweep)
    check_privacy(cfg.privacy)
    for key in ("run", "schema"):
        if key not in cfg.protocol:
            raise ValueError(f"protocol.{key} is missing")
    try:
        get_method(cfg.protocol.run)
        schema = get_class(cfg.protocol.schema)
    except Exception as exc:
        raise ValueError(f"protocol.run / protocol.schema do not resolve: {exc}") from exc
    if not (dataclasses.is_dataclass(schema) and issubclass(schema, Protocol)):
        raise ValueError(f"protocol.schema {cfg.protocol.schema} is not a Protocol dataclass")
    typed = _writable(schema)
    try:
        merged = OmegaConf.merge(typed, OmegaConf.to_container(cfg.protocol, resolve=True))
        protocol = OmegaConf.to_object(merged)
    except Exception as exc:
        raise ValueError(f"protocol block does not fit {schema.__name__}: {exc}") from exc
    check_strategy(cfg, protocol)
    return protocol


def check_privacy(privacy: DictConfig) -> None:
    """Refuse a DP wrapper whose reported (epsilon, delta) would mean nothing: a delta outside
    (0, 1), or no noise (epsilon unbounded: a run without DP is ``privacy=none``)."""
    if privacy.kind != "dp":
        return
    if privacy.delta is None or not 0 < privacy.delta < 1:
        raise ValueError(f"privacy.delta must be in (0, 1) (the chance the reported epsilon fails), "
                         f"got {privacy.delta}")
    sigma = privacy.wrapper.get("noise_multiplier")
    if sigma is None or sigma <= 0:
        raise ValueError(f"privacy.wrapper.noise_multiplier must be > 0 for a run that reports an "
                         f"epsilon, got {sigma} (no noise: no DP; privacy=none runs without a wrapper)")


def entry(node) -> dict:
    """A strategy or wrapper entry as its class takes it: resolved, without fedsim's ``traits``."""
    out = OmegaConf.to_container(OmegaConf.create(node), resolve=True)
    out.pop("traits", None)
    return out


def try_strategy(cfg: DictConfig) -> None:
    """Build the run's strategy and its privacy wrapper once, so that a bad value (a negative
    noise multiplier, an unknown argument) fails before any process starts."""
    strategy = instantiate(entry(cfg.strategy))
    if cfg.privacy.wrapper:
        wrapper = entry(cfg.privacy.wrapper)
        if wrapper.get("num_sampled_clients", 0) is None:  # the run fills it from its slot
            wrapper["num_sampled_clients"] = 1
        instantiate(wrapper, strategy=strategy)


def check_strategy(cfg: DictConfig, protocol: Protocol) -> None:
    """Refuse a strategy or privacy wrapper the experiment cannot run, naming why. Everything
    comes from data: the strategy's ``traits`` (what replies it takes, its aggregation, why HE or
    DP cannot wrap it), the privacy entry's ``kind``, the experiment's ``strategy_slot``."""
    slot, traits, privacy = protocol.strategy_slot, cfg.strategy.get("traits"), cfg.privacy
    name = str(cfg.strategy.get("_target_", "?")).rsplit(".", 1)[-1]
    here = f"experiment {protocol.name} ({slot.role or 'no strategy slot'})"
    if traits is None:
        raise ValueError(f"strategy {name} has no traits block (takes, aggregation, he, dp): "
                         "fedsim cannot tell which experiments and wrappers fit it")
    for what in (traits.takes, traits.aggregation, privacy.kind):
        if what in slot.refuses:
            subject = f"privacy kind '{what}'" if what == privacy.kind else f"strategy {name}"
            raise ValueError(f"{here} cannot run {subject}: {slot.refuses[what]}")
    if traits.takes not in slot.accepts:
        raise ValueError(f"{here} cannot run strategy {name}: it aggregates '{traits.takes}' replies; "
                         f"this experiment's clients send {slot.accepts or 'none a strategy can take'}")
    if privacy.kind != "none" and traits.get(privacy.kind):
        raise ValueError(f"privacy={privacy.kind} cannot wrap strategy {name}: {traits.get(privacy.kind)}")
    if why := protocol.refuses_strategy(OmegaConf.to_container(cfg.strategy, resolve=True)):
        raise ValueError(f"{here} cannot run strategy {name}: {why}")
    under_he = protocol.he_methods()
    for layer, why in ((f"strategy {name}", traits.get("he")), (f"privacy={privacy.kind}", privacy.he)):
        if under_he and why:
            raise ValueError(f"{here}: methods {under_he} run under HE, which cannot take {layer}: {why} "
                             "(leave them out, or run them in plaintext)")
