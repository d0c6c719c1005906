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
import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class, get_method, get_object, instantiate
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from fedsim.clock import traces
from fedsim.code_policy import named_code, refuse_by_definition, refuse_by_name
from fedsim.config.data import REPO_ROOT, who_else_writes
from fedsim.progress import LOG_LEVELS


def require(ok: bool, key: str, rule: str, value) -> None:
    """Refuse ``key``'s ``value`` unless ``ok``, naming the key and the rule it breaks."""
    if not ok:
        raise ValueError(f"{key} must be {rule}, got {value!r}")


def count_or_null(key: str, value: int | None) -> None:
    """A count where null means "all": 0 would read as "all" by accident."""
    require(value is None or value >= 1, key, ">= 1 (null: all)", value)


def check_ray_address(hw: Hardware) -> None:
    """An existing Ray cluster (``hardware.ray_address``) serves a simulation only, at a
    ``host:port``, and is reached over this machine's network: a network namespace of the run's
    own would cut the Ray driver off from the cluster's nodes, which connect back to it."""
    key = "hardware.ray_address"
    require(
        hw.ray_address != "",
        key,
        "given with hardware=ray_cluster: hardware.ray_address=<head host>:<port>",
        hw.ray_address,
    )
    host, _, port = hw.ray_address.rpartition(":")
    require(
        bool(host) and port.isdigit() and 0 < int(port) < 65536,
        key,
        "the cluster head's host:port (`ray start --head --port`)",
        hw.ray_address,
    )
    require(
        hw.backend == "simulation",
        key,
        "null with hardware.backend=deployment (a Ray cluster runs a simulation's clients)",
        hw.ray_address,
    )
    require(
        not hw.private_network,
        key,
        "null with hardware.private_network=true: the cluster's nodes connect "
        "back to the run's Ray driver over this machine's network, which the run's own network "
        "namespace would cut (hardware=ray_cluster sets private_network=false)",
        hw.ray_address,
    )


@dataclass
class Faults:
    """Fault injection into replies, by partition id (``fedsim/runtime/faults.py``; tests)."""

    crash: list[int] = MISSING  # these clients' ClientApp raises
    timeout: list[int] = MISSING  # these sleep timeout_seconds first
    nan: list[int] = MISSING  # these send NaN
    wrong_length: list[int] = MISSING  # these send one value short
    negative: list[int] = MISSING  # these send negative mass
    uninflatable: list[int] = MISSING  # these declare their first array's shape as text
    timeout_seconds: float = MISSING  # sleep of the timeout fault
    message_types: list[str] = MISSING  # replies affected

    def __post_init__(self):
        for kind in ("crash", "timeout", "nan", "wrong_length", "negative", "uninflatable"):
            ids = getattr(self, kind)
            require(all(i >= 0 for i in ids), f"faults.{kind}", "partition ids >= 0", ids)
        require(self.timeout_seconds >= 0, "faults.timeout_seconds", ">= 0", self.timeout_seconds)
        bad = sorted(set(self.message_types) - set(MESSAGE_TYPES))
        require(not bad, "faults.message_types", f"a list of {MESSAGE_TYPES}", self.message_types)


@dataclass
class Waits:
    """Flower's fixed waits on a deployment's message path, in seconds (``fedsim/runtime/flower_waits.py``);
    null keeps Flower's own."""

    superexec_poll: float | None = (
        MISSING  # each SuperNode's SuperExec polls for tasks (Flower: 1.0)
    )
    supernode_idle: float | None = (
        MISSING  # a SuperNode's wait after a pull found no message (Flower: 3)
    )
    supernode_reply: float | None = (
        MISSING  # a SuperNode's poll for its ClientApp's reply (Flower: 0.5)
    )
    pull_backoff: float | None = (
        MISSING  # first retry of an object not uploaded yet (Flower: 1, doubling to 10)
    )

    def __post_init__(self):
        for name in ("superexec_poll", "supernode_idle", "supernode_reply", "pull_backoff"):
            value = getattr(self, name)
            require(
                value is None or value > 0,
                f"hardware.waits.{name}",
                "> 0 seconds (null: Flower's)",
                value,
            )


@dataclass
class Hardware:
    """Where the run executes: Ray simulation resources or a deployment."""

    backend: str = MISSING  # simulation | deployment
    num_supernodes: int | None = MISSING  # null: ceil(num_clients / clients_per_supernode)
    num_clients: int | None = (
        MISSING  # logical clients; null: num_supernodes x per node, else the population
    )
    clients_per_supernode: int = (
        MISSING  # logical clients a SuperNode hosts (at most); >1: one message per SuperNode
    )
    client_backend: str = MISSING  # messages | batched: hosted clients' replies as stacked rows
    num_cpus: int = MISSING  # CPUs Ray may use in all
    ray_address: str | None = MISSING  # simulation: an existing Ray cluster's head host:port
    client_cpus: int = MISSING  # CPUs per ClientApp actor
    client_gpus: float = MISSING  # GPU share per ClientApp actor
    superlink: str | None = MISSING  # deployment: SuperLink address host:port
    launch_local: bool = MISSING  # deployment: start SuperLink + SuperNodes on loopback
    private_network: bool = (
        MISSING  # simulation, launch_local: the run's processes in a network namespace
    )
    insecure: bool = MISSING  # deployment: plain text, no node authentication (warns)
    certificates: str | None = MISSING  # deployment: folder with ca.pem (+ superlink / node keys)
    node_auth: bool = MISSING  # launch_local: SuperNodes authenticate with registered keys
    waits: Waits = MISSING  # deployment: Flower's polls shortened
    clientapp_preload: list[str] | None = (
        MISSING  # libraries a warm process per SuperNode imports once
    )
    clientapp_workers: int = (
        MISSING  # warm ClientApp processes per run and SuperNode that serve its messages
    )

    def __post_init__(self):
        require(self.backend in BACKENDS, "hardware.backend", f"one of {BACKENDS}", self.backend)
        count_or_null("hardware.num_supernodes", self.num_supernodes)
        count_or_null("hardware.num_clients", self.num_clients)
        for name in ("clients_per_supernode", "num_cpus", "client_cpus"):
            require(getattr(self, name) >= 1, f"hardware.{name}", ">= 1", getattr(self, name))
        require(
            self.client_backend in CLIENT_BACKENDS,
            "hardware.client_backend",
            f"one of {CLIENT_BACKENDS}",
            self.client_backend,
        )
        require(
            self.client_backend == "messages" or self.clients_per_supernode > 1,
            "hardware.client_backend",
            "messages unless hardware.clients_per_supernode > 1 (batched stacks a SuperNode's "
            "hosted clients' replies; one client per SuperNode has none to stack)",
            self.client_backend,
        )
        require(
            self.client_gpus >= 0,
            "hardware.client_gpus",
            ">= 0 (a share of a GPU per client)",
            self.client_gpus,
        )
        require(
            self.clientapp_workers >= 0,
            "hardware.clientapp_workers",
            ">= 0",
            self.clientapp_workers,
        )
        require(
            not self.clientapp_workers or self.clientapp_preload is not None,
            "hardware.clientapp_workers",
            "0 unless hardware.clientapp_preload is set (a worker is a fork of the warm process)",
            self.clientapp_workers,
        )
        if self.ray_address is not None:
            check_ray_address(self)


@dataclass
class Logging:
    """Per-exchange metric sinks under results_dir (``fedsim/results/sinks.py``)."""

    csv: bool = MISSING  # metrics.csv, one line per exchange and value
    tensorboard: bool = MISSING  # TensorBoard event files in results_dir/tensorboard
    mlflow: bool = MISSING  # the same metrics to an MLflow store, one MLflow run per run
    mlflow_dir: str = MISSING  # the MLflow store's folder (SQLite, <dir>/mlflow.db)
    level: str = MISSING  # info | debug: debug also shows Flower's lines of fedsim.progress.NOISE

    def __post_init__(self):
        require(self.level in LOG_LEVELS, "logging.level", f"one of {LOG_LEVELS}", self.level)


@dataclass
class Checkpoint:
    """The run's journal under results_dir/checkpoint (``fedsim/runtime/journal.py``)."""

    enabled: bool = MISSING  # journal every completed exchange (resume needs it)
    keep: bool = MISSING  # keep the folder after the run completes (else removed)


@dataclass
class ClientStateSettings:
    """Where clients keep state across rounds (``fedsim/runtime/client_state.py``)."""

    dir: str | None = (
        MISSING  # root of the clients fedsim run starts (fedsim/config/node_local.py); never sent
    )
    keep: bool = MISSING  # keep the run's client state after it completes
    run_key: str | None = MISSING  # set by the ServerApp, not by hand: the run's folder run-<key>


@dataclass
class EffectOfInterest:
    """A difference that matters, the paper's or a stated one: method minus baseline for a paired
    row, or (``baseline: equal_at``) a contrast minus its null."""

    metric: str = MISSING  # pattern of the compared results path (its paired rows, or contrasts, get this effect)
    size: float = MISSING  # the difference, signed, in the metric's units
    source: str = MISSING  # where the size comes from (the paper's table, or why it was chosen)
    baseline: str | None = (
        None  # the sweep.baseline it is against (fedavg); null: any; equal_at: a contrast's null
    )


@dataclass
class RunInterval:
    """An interval the experiment computes inside one run (e.g. a paired bootstrap over items),
    for a difference the seeds do not move."""

    metric: str = MISSING  # pattern of the compared results path
    baseline: str | None = (
        MISSING  # pattern of its baseline's path; null: the metric itself (no pairing)
    )
    ci: str = MISSING  # results path of the run's [low, high]; each * takes the metric's * in turn
    method: str = MISSING  # what the interval is, for the summary


@dataclass
class Contrast:
    """A headline metric that already compares two arms inside each run, on the same items (a
    head-to-head win rate, a reward difference): its verdict is against ``equal_at``, with no
    baseline to subtract. Its effect of interest is one stated with ``baseline: equal_at``, a
    difference from ``equal_at``."""

    metric: str = MISSING  # pattern of its results path
    equal_at: float = (
        MISSING  # its value when the arms are equal, the null (0.5 a win rate, 0 a difference)
    )


@dataclass
class Plan:
    """A sweep's pre-registered analysis, fixed before its first run (``fedsim/run/sweep.py``
    hashes it into sweep.json): the primary endpoints, the family-wise alpha, the planned seeds
    and the looks at which the comparison is read. No primary endpoint: no plan."""

    primary: list[str] = (
        MISSING  # patterns of the primary paired or contrast rows' metrics; the rest are secondary
    )
    alpha: float = (
        MISSING  # two-sided type I error of the primaries over all looks, and of the Holm family
    )
    seeds: int = MISSING  # planned seeds (fedsim compare --plan on a pilot)
    looks: list[int] = MISSING  # seeds at which the comparison is read; [] = [seeds]
    spending: str = MISSING  # Lan-DeMets alpha spending: obrien_fleming | pocock


@dataclass
class Sweep:
    """How ``fedsim run -m`` / ``fedsim compare`` summarize a sweep: the one type of the sweep settings,
    read by ``fedsim/results/comparison.py`` as :func:`typed_sweep` builds it."""

    seed_keys: list[str] = MISSING  # overrides that are replicates
    baseline: str | None = MISSING  # a method name inside results, or KEY=VALUE of a swept override
    metrics: list[str] = (
        MISSING  # the headline: results.json path patterns, a family each; [] = all
    )
    bookkeeping: list[str] = (
        MISSING  # patterns of counters, bytes, timings: their own section, never headline
    )
    interval: str = MISSING  # t (Student t over seeds) | bootstrap (scipy.stats.bootstrap, BCa)
    level: float = MISSING  # confidence level of every interval
    power: float = MISSING  # power of the minimum detectable effect and of the seeds needed
    effect_of_interest: list[EffectOfInterest] = MISSING  # effects whose exclusion is a verdict
    run_intervals: list[RunInterval] = (
        MISSING  # per-run intervals used when the seeds give no spread
    )
    contrasts: list[Contrast] = (
        MISSING  # metrics that compare two arms themselves, judged against their null
    )
    plan: Plan = MISSING  # the pre-registered analysis; primary [] = no plan: every row is secondary (Holm-adjusted)

    def planned(self) -> dict | None:
        """``plan`` as the comparison reads it and sweep.json hashes it; None without a primary endpoint."""
        return dataclasses.asdict(self.plan) if self.plan.primary else None


@dataclass
class Audit:
    """The empirical privacy audit beside the accountant (``fedsim/privacy/audit.py``)."""

    enabled: bool = MISSING  # canaries in the run's DP releases, a measured lower bound on epsilon
    canaries: int = MISSING  # canaries, each in or out on a secret fair coin
    confidence: float = MISSING  # of all the run's lower bounds together
    guess_shares: list[float] = MISSING  # shares of the canaries guessed; the best bound over them

    def __post_init__(self):
        require(self.canaries >= 2, "privacy.audit.canaries", ">= 2", self.canaries)
        require(0 < self.confidence < 1, "privacy.audit.confidence", "in (0, 1)", self.confidence)
        require(
            bool(self.guess_shares) and all(0 < s <= 1 for s in self.guess_shares),
            "privacy.audit.guess_shares",
            "a non-empty list of shares in (0, 1]",
            self.guess_shares,
        )


@dataclass
class Privacy:
    """How private the run's DP releases are (``fedsim/privacy/dp.py``), and the wrapper around the
    run's strategy (``conf/privacy/*.yaml``)."""

    reproducible_noise: bool = MISSING  # noise from the public seed: reproducible, not private
    audit: Audit = MISSING  # the measured lower bound beside the accountant's epsilon
    kind: str = MISSING  # none | dp (Flower DP wrappers) | he | secagg | secagg_ddp
    wrapper: Any = MISSING  # the wrapper's _target_ and settings; null: none
    he: str | None = MISSING  # why this wrapper cannot run inside HE (null: it can)
    delta: float | None = MISSING  # delta of the (epsilon, delta) a dp wrapper's run reports


@dataclass
class ClockSynthetic:
    """The seeded synthetic clients of ``clock=synthetic`` (``fedsim/clock/traces.py``)."""

    seconds_per_example: float = MISSING  # median training seconds per example
    speed_sigma: float = MISSING  # lognormal sigma of the speed
    kbps: float = MISSING  # median bandwidth, kbit/s each way
    bandwidth_sigma: float = MISSING  # lognormal sigma of the bandwidth
    online_hours: float = MISSING  # hours online a day (24: always)
    day_seconds: float = MISSING  # the availability's period

    def __post_init__(self):
        for name in ("seconds_per_example", "kbps", "day_seconds"):
            require(getattr(self, name) > 0, f"clock.synthetic.{name}", "> 0", getattr(self, name))
        for name in ("speed_sigma", "bandwidth_sigma"):
            require(
                getattr(self, name) >= 0, f"clock.synthetic.{name}", ">= 0", getattr(self, name)
            )
        require(
            0 < self.online_hours <= 24,
            "clock.synthetic.online_hours",
            "in (0, 24]",
            self.online_hours,
        )


@dataclass
class About:
    """What ``fedsim experiments`` lists of an experiment: each ``conf/experiment/*.yaml`` states
    its own (``tests/test_configs.py``); nothing in a run reads it."""

    shows: str | None = MISSING  # one line: what the experiment shows
    seconds: float | None = MISSING  # wall time of one run on 2 CPU cores; null: not measured
    measured: str | None = MISSING  # where that time was measured (a record's sweep.json)

    def __post_init__(self):
        require(
            (self.seconds is None) == (self.measured is None),
            "about.measured",
            "set exactly when about.seconds is (where the time was measured)",
            self.measured,
        )


@dataclass
class ClockTrace:
    """FedScale's trace files of ``clock=trace`` (docs/clock.md)."""

    device_capacity: str = MISSING  # client_device_capacity: speed and bandwidth per client
    availability: str | None = MISSING  # client_behave_trace: online intervals; null: always online


@dataclass
class Clock:
    """The virtual clock (``fedsim/clock/``): clients' speed, bandwidth, availability."""

    kind: str = MISSING  # none | synthetic | trace
    deadline: float | None = MISSING  # virtual seconds a synchronous round stays open
    over_selection: float = MISSING  # sampled / awaited per synchronous round
    synthetic: ClockSynthetic | None = MISSING  # clock=synthetic's generator
    trace: ClockTrace | None = MISSING  # clock=trace's files

    def __post_init__(self):
        require(self.kind in CLOCKS, "clock.kind", f"one of {CLOCKS}", self.kind)
        require(
            self.deadline is None or self.deadline > 0,
            "clock.deadline",
            "> 0 virtual seconds (null: none)",
            self.deadline,
        )
        require(self.over_selection >= 1, "clock.over_selection", ">= 1", self.over_selection)
        for block in ("synthetic", "trace"):
            require(
                (getattr(self, block) is not None) == (self.kind == block),
                f"clock.{block}",
                f"set with clock={block} only (choose the group: clock={block})",
                getattr(self, block),
            )


@dataclass
class RunConfig:
    task: Any = MISSING  # conf/task/*.yaml: data, client handler, metrics
    strategy: Any = MISSING  # conf/strategy/*.yaml: a Flower Strategy _target_
    hardware: Hardware = MISSING  # conf/hardware/*.yaml
    protocol: Any = MISSING  # conf/experiment/*.yaml: checked by its schema
    data_root: str | None = MISSING
    results_dir: str | None = MISSING
    seed: int = MISSING
    num_rounds: int = MISSING
    round_timeout: float = MISSING
    ship_results: bool = MISSING  # set by the launcher for a remote SuperLink
    checkpoint: Checkpoint = MISSING
    resume: bool = MISSING  # set by `fedsim run resume=DIR`: replay the journal
    privacy: Privacy = MISSING
    logging: Logging = MISSING
    faults: Faults = MISSING
    sweep: Sweep = MISSING
    client_state: ClientStateSettings = MISSING
    clock: Clock = MISSING  # conf/clock/*.yaml: the virtual clock
    about: About = MISSING

    def __post_init__(self):
        require(self.num_rounds >= 1, "num_rounds", ">= 1", self.num_rounds)
        require(self.round_timeout > 0, "round_timeout", "> 0 seconds", self.round_timeout)
        if self.results_dir is not None:
            _check_output_folder("results_dir", Path(self.results_dir))
        if self.logging.mlflow:
            _check_output_folder("logging.mlflow_dir", Path(self.logging.mlflow_dir))


def _check_output_folder(key: str, path: Path) -> None:
    """A folder the run will write: not an existing file, and creatable where it does not exist yet
    (its nearest existing parent a writable folder)."""
    require(
        not path.exists() or path.is_dir(), key, "a folder (it names an existing file)", str(path)
    )
    parent = next(p for p in (path, *path.parents) if p.exists())
    require(
        parent.is_dir() and os.access(parent, os.W_OK | os.X_OK),
        key,
        f"a folder this user can create or write ({parent} is not writable)",
        str(path),
    )
    if why := who_else_writes(path):
        raise ValueError(
            f"{key}: {why}, so another user could plant links where results go or swap them: "
            f"choose a folder only you (and root) can write, got {path}"
        )


@dataclass(frozen=True, kw_only=True)
class StrategySlot:
    """Where an experiment runs the top-level ``strategy`` (and ``privacy``'s wrapper around it):
    what its clients' replies are and what it refuses, with why."""

    role: str  # the methods / phases that run it
    accepts: list[str]  # reply contracts its clients speak (a strategy's traits.takes)
    honours: list[
        str
    ]  # train-config keys a strategy sends that its clients act on (traits.client_keys); [] = none
    sets: list[
        str
    ]  # strategy arguments its protocol sets itself: strategy.<key> would act on nothing
    refuses: dict[
        str, str
    ]  # a reply contract, aggregation, client key or privacy kind -> why not here
    loss_key: str | None  # the metric its clients report their training loss under (QFedAvg)


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """Keys every experiment's ``protocol`` block has."""

    name: str  # results folder name
    run: str  # the server-side protocol function, run(messenger, cfg, out)
    schema: str  # this block's dataclass (a subclass of Protocol)
    strategy_slot: StrategySlot
    """where ``strategy=`` and ``privacy=`` act in this experiment"""

    def he_methods(self) -> list[str]:
        """The methods that run the strategy under HE whatever ``privacy`` says."""
        return []

    def method_names(self) -> list[str]:
        """The names its results give the arms they compare: what a method-name
        ``sweep.baseline`` can be, checked before a sweep's first run, and the methods a
        comparison lists. Here the non-null entries of a ``methods`` block (none without one);
        a protocol whose results name arms otherwise adds them."""
        return [name for name, spec in (getattr(self, "methods", None) or {}).items() if spec]

    def refuses_strategy(self, settings: dict) -> str | None:
        """Why this protocol's own settings cannot run the slot's strategy (its constructor
        ``settings``), when that depends on more than the slot's fixed ``refuses``."""
        return None

    def check_run(self, cfg: DictConfig, clients: int | None) -> None:
        """Refuse a setting that does not fit the rest of the run (``clients``: its logical
        clients, None until the population is known): a cross-field rule, checked with the other
        checks before any process starts, not minutes into the run."""

    def refuses_clock(self) -> str | None:
        """Why this protocol cannot run on the virtual clock (None: it can). Refused unless a
        protocol says otherwise: one that builds a grid of its own (not ``RunContext.fedavg``)
        asks Flower for its clients without the clock's quorum, and Flower's sampling would wait
        forever for clients the clock keeps offline."""
        return (
            "its exchanges are not built on the clock's quorum (RunContext.fedavg), so a round "
            "could wait forever for clients the clock keeps offline"
        )

    def refuses_audit(self, cfg: DictConfig) -> str | None:
        """Why ``privacy.audit`` cannot run here (None: it can): an experiment audits only the
        releases it puts canaries into."""
        return (
            "it puts no canaries into its releases (privacy.audit runs on FedTP's DPMean release)"
        )


@dataclass(frozen=True, kw_only=True)
class TaskSettings:
    """Keys every ``task`` block has (``conf/task/*.yaml``); the dataclass its ``schema`` names
    (a subclass, beside the task's code) types the rest, so a task's wrong key or value is
    refused before the run as a protocol's is."""

    name: str  # task name in results
    client: str  # ClientApp handler class
    schema: str  # this block's dataclass (a subclass of TaskSettings)
    data_root: str | None  # data folder, never sent to clients; null: the task reads no data
    unit: (
        str  # the cluster a per-run interval resamples: what a client is made of (one of ``units``)
    )
    units: ClassVar[tuple[str, ...]] = ()
    """the units the task's items carry, so that its intervals can group them (its subclass says)"""

    def __post_init__(self):
        require(self.unit in self.units, "task.unit", f"one of {self.units}", self.unit)


ConfigStore.instance().store(name="fedsim_schema", node=RunConfig)

BACKENDS = ("simulation", "deployment")
CLIENT_BACKENDS = ("messages", "batched")  # hardware.client_backend
CLOCKS = ("none", "synthetic", "trace")
MESSAGE_TYPES = ("train", "evaluate", "query")
INTERVALS = ("t", "bootstrap")
SPENDING = ("obrien_fleming", "pocock")  # Lan-DeMets alpha spending (fedsim/results/stats.py)


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
    ``l mod K`` (``fedsim/runtime/sharded_grid.py``). Refuses counts that leave a SuperNode empty or a
    client without one."""
    per = int(hw.clients_per_supernode)
    if per < 1:
        raise ValueError(f"hardware.clients_per_supernode must be >= 1, got {per}")
    clients = hw.num_clients or (hw.num_supernodes * per if hw.num_supernodes else population)
    supernodes = hw.num_supernodes or -(-clients // per)
    if clients < 1 or not supernodes <= clients <= supernodes * per:
        raise ValueError(
            f"hardware: {clients} clients do not fit {supernodes} SuperNodes x "
            f"{per} clients_per_supernode (every SuperNode hosts 1..{per} clients)"
        )
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
    if (
        sweep.interval not in INTERVALS
        or not 0.0 < sweep.level < 1.0
        or not 0.0 < sweep.power < 1.0
    ):
        raise ValueError(
            f"sweep.interval must be one of {INTERVALS}, 0 < sweep.level < 1 and 0 < sweep.power < 1, "
            f"got {sweep.interval!r}, {sweep.level}, {sweep.power}"
        )
    if sweep.plan.primary:
        check_plan(sweep.plan)
    return sweep


def typed_sweep(*layers) -> Sweep:
    """The ``sweep`` block from ``layers``, checked by :func:`sweep_settings`, as its dataclass; an
    interpolation stays text (a record's config.yaml may hold ``${oc.env:...}``: never resolved)."""
    values = OmegaConf.to_container(sweep_settings(*layers))  # OmegaConf.to_object would resolve
    entries = {
        "effect_of_interest": EffectOfInterest,
        "run_intervals": RunInterval,
        "contrasts": Contrast,
    }
    return Sweep(
        **values
        | {key: [kind(**e) for e in values[key]] for key, kind in entries.items()}
        | {"plan": Plan(**values["plan"])}
    )


def check_plan(plan: DictConfig) -> None:
    """Refuse a plan that cannot be followed, naming its key: an alpha outside (0, 1), fewer
    than two seeds, looks that are not increasing seed counts ending at the planned seeds, an
    unknown spending function. ``looks: []`` becomes ``[seeds]``."""
    if not plan.looks:
        plan.looks = [plan.seeds]
    looks = list(plan.looks)
    for key, ok, rule in (
        ("alpha", 0.0 < plan.alpha < 1.0, "within (0, 1)"),
        ("seeds", plan.seeds >= 2, "at least 2"),
        (
            "looks",
            looks == sorted(set(looks)) and looks[0] >= 2 and looks[-1] == plan.seeds,
            "increasing seed counts, from 2, ending at sweep.plan.seeds",
        ),
        ("spending", plan.spending in SPENDING, f"one of {SPENDING}"),
    ):
        value = getattr(plan, key)
        require(
            ok,
            f"sweep.plan.{key}",
            rule,
            OmegaConf.to_container(value) if isinstance(value, DictConfig | list) else value,
        )


def check(cfg: DictConfig) -> Protocol:
    """Refuse what composition cannot see: code outside fedsim's and Flower's (first, before
    anything is imported), keys added with ``+``, values out of range (each block's
    ``__post_init__``), callables, cross-field rules, the protocol block's keys and types.
    Returns the protocol block as its dataclass."""
    check_code(cfg)
    refuse_unknown_keys(cfg, RunConfig)
    OmegaConf.to_object(cfg)  # every typed block's __post_init__: ranges and enums
    hw = cfg.hardware
    if hw.backend == "deployment" and not (hw.launch_local or hw.superlink):
        raise ValueError("hardware.superlink (host:port) is required for a remote deployment")
    if hw.backend == "deployment" and not (hw.launch_local or hw.insecure or hw.certificates):
        raise ValueError(
            "hardware.certificates (a folder with the federation's ca.pem) is "
            "required for a remote SuperLink; hardware.insecure=true for plain text"
        )
    if hw.backend == "deployment" and not hw.launch_local and cfg.privacy.reproducible_noise:
        raise ValueError(
            "privacy.reproducible_noise=true draws DP noise from the public seed "
            "(not private): allowed in simulation and hardware=deploy_local only (one machine, "
            "the simulation's parity check), refused for a remote SuperLink"
        )
    if cfg.logging.mlflow and hw.backend == "deployment" and not hw.launch_local:
        raise ValueError(
            "logging.mlflow writes where the ServerApp runs: simulation or "
            "hardware.launch_local only, refused for a remote SuperLink"
        )
    layout(hw, 1)  # the client / SuperNode counts fit (the population is checked by the CLI)
    sweep_settings(cfg.sweep)
    check_privacy(cfg.privacy)
    typed_block(cfg, "task", TaskSettings)
    protocol = protocol_of(cfg)
    check_strategy(cfg, protocol)
    check_clock(cfg, protocol)
    protocol.check_run(cfg, hw.num_clients)
    if cfg.privacy.audit.enabled and (why := protocol.refuses_audit(cfg)):
        raise ValueError(
            f"privacy.audit.enabled=true is refused for experiment {protocol.name}: {why}"
        )
    return protocol


def check_clock(cfg: DictConfig, protocol: Protocol) -> None:
    """Refuse a clock the run cannot keep, naming why: an asynchronous strategy without one, a
    clock under a privacy wrapper or where the protocol needs every sampled client, and a trace
    file that does not read (a bad row named)."""
    clock, name = cfg.clock, str(cfg.strategy.get("_target_", "?")).rsplit(".", 1)[-1]
    if cfg.strategy.traits.aggregation == "async" and clock.kind == "none":
        raise ValueError(
            f"strategy {name} is asynchronous: it runs on the virtual clock (clock=synthetic or "
            "clock=trace), which says when each update arrives; clock=none has no time"
        )
    if clock.kind == "none":
        return
    if cfg.privacy.kind != "none":
        raise ValueError(
            f"clock={clock.kind} cannot run under privacy={cfg.privacy.kind}: the clock leaves "
            "stragglers' updates out after the wrapper sampled them, so its noise and accounting "
            "would be calibrated to clients that did not contribute"
        )
    if why := protocol.refuses_clock():
        raise ValueError(f"clock={clock.kind} is refused for experiment {protocol.name}: {why}")
    if clock.kind == "trace":  # a bad row is refused here, named, before anything starts
        traces.read_trace(clock.trace.device_capacity, traces.device_row)
        if clock.trace.availability is not None:
            traces.read_trace(clock.trace.availability, traces.availability_row)


def protocol_of(cfg: DictConfig) -> Protocol:
    """The ``protocol`` block as the dataclass its ``protocol.schema`` names; ``protocol.run``
    must name a callable."""
    protocol = typed_block(cfg, "protocol", Protocol)
    try:
        get_method(cfg.protocol.run)
    except Exception as exc:
        raise ValueError(f"protocol.run does not resolve: {exc}") from exc
    return protocol


def typed_block(cfg: DictConfig, block: str, base: type):
    """``cfg[block]`` as the dataclass its ``schema`` key names (a subclass of ``base``): an
    unknown key, a missing one or a wrong type is refused, naming the key and the type it
    needs; each ``_target_`` entry's settings are checked against its class's constructor."""
    node = cfg[block]
    if "schema" not in node:
        raise ValueError(f"{block}.schema is missing: the dataclass that types the {block} block")
    try:
        schema = get_class(node.schema)
    except Exception as exc:
        raise ValueError(f"{block}.schema does not resolve: {exc}") from exc
    if not (dataclasses.is_dataclass(schema) and issubclass(schema, base)):
        raise ValueError(f"{block}.schema {node.schema} is not a {base.__name__} dataclass")
    values = OmegaConf.to_container(node, resolve=True)
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(_writable(schema), values))
    except OmegaConfBaseException as exc:
        raise ValueError(typed_error(block, schema, exc)) from exc
    for key, settings in _entries(values, block):
        check_entry(key, settings)
    return typed


def _entries(value, key: str):
    """Every ``_target_`` entry inside ``value`` (a partitioner, a selector), with its key."""
    if isinstance(value, dict):
        if "_target_" in value:
            yield key, value
        for name, inner in value.items():
            yield from _entries(inner, f"{key}.{name}")


def check_code(cfg: DictConfig) -> None:
    """Refuse code the config names outside fedsim's and Flower's strategies
    (``fedsim/code_policy.py``): every name first, before anything is imported, then what each
    resolves to. A name that does not resolve is left to the check that uses it, which names it."""
    try:
        named = list(named_code(OmegaConf.to_container(cfg, resolve=True)))
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve
        raise ValueError(str(exc)) from exc
    refuse_by_name(named)
    for key, path in named:
        try:
            found = get_object(path)
        except Exception:  # left to the check that uses it, which names it
            continue
        refuse_by_definition(key, path, found)


def refuse_unknown_keys(node: DictConfig, schema: type, prefix: str = "") -> None:
    """Hydra refuses an unknown key of a typed block, except one added with ``+`` (``+foo=1``,
    ``+hardware.foo=1``), which the run would carry and ignore: refused here, with the near keys."""
    hints = typing.get_type_hints(schema)
    for key in node:
        if key not in hints:
            raise ValueError(unknown_key(f"{prefix}{key}", list(hints)))
        if dataclasses.is_dataclass(hints[key]) and isinstance(node[key], DictConfig):
            refuse_unknown_keys(node[key], hints[key], f"{prefix}{key}.")


def unknown_key(key: str, valid: list[str]) -> str:
    parent, _, leaf = key.rpartition(".")
    near = difflib.get_close_matches(leaf, valid, n=3)
    return (
        f"Unknown config key '{key}'."
        + (f" Did you mean: {', '.join(near)}?" if near else "")
        + f" Keys under '{parent or '<root>'}': {', '.join(valid)}"
    )


def typed_error(block: str, schema: type, exc: OmegaConfBaseException) -> str:
    """OmegaConf's error about ``block`` (typed by ``schema``) as one line naming the key, the type
    it needs and the value given (OmegaConf's own says "AnyNode is not a ListConfig")."""
    path = re.sub(r"\[\d+\]", "", str(exc.full_key or exc.key or ""))
    key = f"{block}.{exc.full_key}" if exc.full_key else block
    parts, kind = path.split(".") if path else [], schema
    for part in parts[:-1]:
        kind = typing.get_type_hints(kind).get(part) if dataclasses.is_dataclass(kind) else None
    hints = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {}
    if isinstance(exc, ConfigKeyError) and parts and parts[-1] not in hints:
        return unknown_key(f"{block}.{path}", list(hints))
    if isinstance(exc, MissingMandatoryValue):
        return f"{key}: missing mandatory value (every key needs one in conf/ or an override)"
    expected = hints.get(parts[-1]) if parts else None
    if expected is not None and str(exc.full_key).endswith("]"):  # an element of a list or dict
        expected = typing.get_args(expected)[-1]
    value = getattr(exc, "value", None)
    value = getattr(value, "_value", lambda: value)() if hasattr(value, "_value") else value
    return (
        f"{key}: expected {type_name(expected)}, got {value!r}"
        if expected is not None
        else f"{key}: {exc.msg.splitlines()[0]}"
    )


def type_name(kind) -> str:
    plain = isinstance(kind, type) and typing.get_origin(kind) is None
    return kind.__name__ if plain else str(kind).replace("typing.", "")


DP_WRAPPERS = tuple(
    f"flwr.serverapp.strategy.DifferentialPrivacy{side}Side{clipping}Clipping"
    for side in ("Server", "Client")
    for clipping in ("Fixed", "Adaptive")
)  # Flower's public central-DP wrappers (fedsim's own subclass them): privacy.kind=dp


def dp_wrappers() -> tuple[type, ...]:
    """The classes of ``DP_WRAPPERS``, resolved by name as every ``_target_`` is: the config
    floor (which the Flower-free tasks layer reads) imports no Flower."""
    return tuple(get_class(name) for name in DP_WRAPPERS)


def wrapper_kind(wrapper) -> str:
    """What a privacy wrapper does, read from its class: none (no wrapper), dp (a Flower DP
    wrapper), he or secagg (a class declaring ``privacy_kind``: HEFedAvg, SecAggPlus), else other."""
    if not wrapper:
        return "none"
    cls = get_class(wrapper["_target_"])
    if issubclass(cls, dp_wrappers()):
        return "dp"
    declared = getattr(cls, "privacy_kind", None)
    return declared if declared in ("he", "secagg", "secagg_ddp") else "other"


def check_privacy(privacy: DictConfig) -> None:
    """Refuse a ``privacy.kind`` that is not its wrapper's (a label anyone can set: a DP wrapper
    labelled none would noise from the public seed with nothing accounted, HEFedAvg labelled
    none would encrypt while the protocol and results say plaintext), and a DP wrapper whose
    reported (epsilon, delta) would mean nothing: a delta outside (0, 1), or no noise (epsilon
    unbounded: a run without DP is ``privacy=none``)."""
    kind = wrapper_kind(privacy.wrapper)
    if kind != privacy.kind:
        target = privacy.wrapper["_target_"] if privacy.wrapper else None
        raise ValueError(
            f"privacy.kind={privacy.kind} does not match privacy.wrapper {target} (a {kind} "
            f"wrapper): the run's privacy follows the wrapper it builds; choose privacy=none, "
            f"a dp_* wrapper, he_fedavg, secagg or secagg_ddp and leave privacy.kind as that "
            "file sets it"
        )
    if kind == "secagg_ddp":
        refuse_ddp(privacy)
    if kind != "dp":
        return
    if privacy.delta is None or not 0 < privacy.delta < 1:
        raise ValueError(
            f"privacy.delta must be in (0, 1) (the chance the reported epsilon fails), "
            f"got {privacy.delta}"
        )
    sigma = privacy.wrapper.get("noise_multiplier")
    if not is_number(sigma) or sigma <= 0:
        raise ValueError(
            f"privacy.wrapper.noise_multiplier must be > 0 for a run that reports an "
            f"epsilon, got {sigma} (no noise: no DP; privacy=none runs without a wrapper)"
        )


def refuse_ddp(privacy: DictConfig) -> None:
    """What distributed DP cannot do: the in-run audit (it needs the exact clipped sum, which only
    the clients hold; ``bench/privacy_audit.py --ddp`` audits the mechanism), and noise from the
    public seed (each client draws its share from its own entropy)."""
    if privacy.audit.enabled:
        raise ValueError(
            "privacy=secagg_ddp cannot run privacy.audit.enabled=true: the audit needs the "
            "exact clipped sum, which only the clients hold; audit the mechanism with "
            "bench/privacy_audit.py --ddp"
        )
    if privacy.reproducible_noise:
        raise ValueError(
            "privacy=secagg_ddp cannot run privacy.reproducible_noise=true: each client draws "
            "its noise share from its own entropy, which no seed reproduces"
        )


def entry(node) -> dict:
    """A strategy or wrapper entry as its class takes it: resolved, without fedsim's ``traits``."""
    out = OmegaConf.to_container(OmegaConf.create(node), resolve=True)
    out.pop("traits", None)
    return out


def try_strategy(cfg: DictConfig) -> None:
    """Build the run's strategy and its privacy wrapper once, so that a bad value (a negative
    noise multiplier, an unknown argument, a word where a number goes) fails before any process
    starts, naming the key."""
    strategy = build_entry("strategy", entry(cfg.strategy))
    if cfg.privacy.wrapper:
        wrapper = entry(cfg.privacy.wrapper)
        if wrapper.get("num_sampled_clients", 0) is None:  # the run fills it from its slot
            wrapper["num_sampled_clients"] = 1
        build_entry("privacy.wrapper", wrapper, strategy=strategy)


def check_entry(key: str, settings: dict) -> None:
    """Each setting of a ``_target_`` entry against the type its class's constructor declares
    (Flower's strategies and flwr-datasets' partitioners type every argument):
    ``strategy.fraction_train=high`` is refused as such, not by a ``'<' not supported`` from
    deep inside the constructor, or minutes into the run."""
    try:
        declared = typing.get_type_hints(get_class(settings["_target_"]).__init__)
    except Exception as exc:  # an annotation naming what its module imports for type checkers only
        if isinstance(exc, (ImportError, AttributeError, ValueError)) and "Error locating" in str(
            exc
        ):
            raise ValueError(f"{key}._target_: {exc}") from exc
        declared = {}
    for name, value in settings.items():
        if name in declared and not fits(value, declared[name]):
            raise ValueError(f"{key}.{name}: expected {type_name(declared[name])}, got {value!r}")


def build_entry(key: str, settings: dict, **given):
    """``instantiate(settings)`` once its settings passed :func:`check_entry`."""
    check_entry(key, settings)
    try:
        return instantiate(settings, **given)
    except Exception as exc:
        raise ValueError(f"{key} ({settings['_target_']}): {exc}") from exc


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


SCALAR_CHECKS = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: is_number(v),
    str: lambda v: isinstance(v, str),
    type(None): lambda v: v is None,
}


def fits(value, kind) -> bool:
    """Whether a scalar config value (a number, a word, a bool, null) fits a declared type: one
    of its options is that scalar type, or a class the check cannot judge (left to the
    constructor); a list, a dict or an array type takes no scalar. A list or dict value is left
    to the constructor."""
    if isinstance(value, list | dict):
        return True
    options = (
        typing.get_args(kind)
        if typing.get_origin(kind) in (typing.Union, types.UnionType)
        else (kind,)
    )
    for option in options:
        if option in SCALAR_CHECKS:
            if SCALAR_CHECKS[option](value):
                return True
        elif typing.get_origin(option) is typing.Literal:
            if value in typing.get_args(option):
                return True
        elif option is typing.Any or (
            isinstance(option, type)
            and typing.get_origin(option) is None
            and not issubclass(option, list | dict | tuple | set)
        ):
            return True
    return False


def check_strategy(cfg: DictConfig, protocol: Protocol) -> None:
    """Refuse a strategy or privacy wrapper the experiment cannot run, naming why. Everything
    comes from data: the strategy's ``traits`` (what replies it takes, its aggregation, the
    train-config keys its clients must act on, why HE or DP cannot wrap it), the privacy entry's
    ``kind``, the experiment's ``strategy_slot``."""
    slot, traits, privacy = protocol.strategy_slot, cfg.strategy.get("traits"), cfg.privacy
    name = str(cfg.strategy.get("_target_", "?")).rsplit(".", 1)[-1]
    here = f"experiment {protocol.name} ({slot.role or 'no strategy slot'})"
    if traits is None:
        raise ValueError(
            f"strategy {name} has no traits block (takes, aggregation, client_keys, he, dp): "
            "fedsim cannot tell which experiments and wrappers fit it"
        )
    for what in (
        traits.takes,
        traits.aggregation,
        *(traits.get("client_keys") or []),
        privacy.kind,
    ):
        if what in slot.refuses:
            subject = f"privacy kind '{what}'" if what == privacy.kind else f"strategy {name}"
            raise ValueError(f"{here} cannot run {subject}: {slot.refuses[what]}")
    if traits.takes not in slot.accepts:
        raise ValueError(
            f"{here} cannot run strategy {name}: it aggregates '{traits.takes}' replies; "
            f"this experiment's clients send {slot.accepts or 'none a strategy can take'}"
        )
    if privacy.kind != "none" and privacy.kind not in traits:
        raise ValueError(
            f"strategy {name} has no traits.{privacy.kind}: fedsim cannot tell whether "
            f"privacy={privacy.kind} can wrap it (null: it can; else why not)"
        )
    refuse_inert(cfg, protocol, name, here)
    if privacy.kind != "none" and traits.get(privacy.kind):
        raise ValueError(
            f"privacy={privacy.kind} cannot wrap strategy {name}: {traits.get(privacy.kind)}"
        )
    if why := protocol.refuses_strategy(OmegaConf.to_container(cfg.strategy, resolve=True)):
        raise ValueError(f"{here} cannot run strategy {name}: {why}")
    under_he = protocol.he_methods()
    for layer, why in (
        (f"strategy {name}", traits.get("he")),
        (f"privacy={privacy.kind}", privacy.he),
    ):
        if under_he and why:
            raise ValueError(
                f"{here}: methods {under_he} run under HE, which cannot take {layer}: {why} "
                "(leave them out, or run them in plaintext)"
            )


def refuse_inert(cfg: DictConfig, protocol: Protocol, name: str, here: str) -> None:
    """Refuse what would act on nothing, by default: a method honours only what its slot
    declares. A train-config key the strategy sends (``traits.client_keys``: FedProx's
    ``proximal-mu``) that the slot's clients do not act on (``strategy_slot.honours``) would run
    the plain aggregation under another name; a loss-weighted aggregation needs the clients'
    training loss (``strategy_slot.loss_key``); HE needs clients that encrypt (``task.he``); an
    argument the protocol sets itself (``strategy_slot.sets``: the clients sampled per round)
    keeps the value of the strategy's file."""
    slot, traits = protocol.strategy_slot, cfg.strategy.traits
    for key in traits.get("client_keys") or []:
        if key not in slot.honours:
            settings = [k for k in cfg.strategy if k.replace("_", "-") == key] or [key]
            raise ValueError(
                f"strategy.{settings[0]}: {here} cannot run strategy {name}: it sends '{key}' to "
                f"clients that act on none of it (strategy_slot.honours: "
                f"{list(slot.honours) or 'none'}), so the run would be the plain aggregation "
                f"under {name}'s name"
            )
    stated = strategy_file(cfg.strategy.get("_target_"))
    for key in slot.sets:
        if stated is not None and key in cfg.strategy and cfg.strategy[key] != stated.get(key):
            raise ValueError(
                f"strategy.{key}={cfg.strategy[key]}: {here} sets {key} itself (strategy_slot.sets), "
                f"so this value would act on nothing; leave it at {stated.get(key)}"
            )
    if traits.aggregation == "loss_weighted" and not (
        cfg.strategy.get("train_loss_key") or slot.loss_key
    ):
        raise ValueError(
            f"strategy.train_loss_key: {here} cannot run strategy {name}: its clients report no "
            "training loss to weight by (strategy_slot.loss_key is null)"
        )
    if cfg.privacy.kind == "he" and not cfg.task.get("he"):
        raise ValueError(
            f"privacy.wrapper: {here} cannot run privacy kind 'he': task {cfg.task.name} "
            "carries no CKKS parameters (task.he), so no client would encrypt"
        )


def strategy_file(target: str | None) -> DictConfig | None:
    """The ``conf/strategy/*.yaml`` entry of the class ``target`` (None: no file names it), whose
    values are the ones a run takes unless an override changes them."""
    for path in sorted((REPO_ROOT / "conf" / "strategy").glob("*.yaml")):
        entry = OmegaConf.load(path)
        if entry.get("_target_") == target:
            return entry
    return None
