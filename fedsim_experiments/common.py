"""What every per-paper protocol shares: who the clients are, and the context a method runner
gets."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result, Strategy
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig

from fedsim.clock.schedule import VirtualClock
from fedsim.config.schema import dp_wrappers
from fedsim.config.schema import entry as schema_entry
from fedsim.message_keys import CONFIG, INFO, PARTITION_ID
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.validators import Validator
from fedsim_strategies.numpy_noise import NumpyNoise, account


def build_strategy(
    cfg: DictConfig, plan: PrivacyPlan, clients: int, entry=None, he: dict | None = None, **args
) -> Strategy:
    """A method's strategy, with the slot's ``args`` (sampling, record keys). ``entry`` None is
    the experiment's slot: the run's ``strategy`` inside the run's ``privacy`` wrapper (HEFedAvg
    where the plan runs the slot under HE); ``he``, a method's own HE settings, wraps it in
    HEFedAvg instead (``plan.he_wrapper``); a method's own entry runs as it is. The entry's
    ``traits`` are fedsim's data, not the class's; a null ``train_loss_key`` is the slot's
    ``loss_key``; a wrapper's null ``num_sampled_clients`` is how many the strategy samples of
    ``clients``. A strategy that draws noise of its own takes the plan's at construction; Flower's
    DP wrappers draw theirs from the plan's source (``NumpyNoise``) and spend from the run's one
    central account (``plan.central``), which results.json reports."""
    slot = entry is None
    settings = schema_entry(cfg.strategy if slot else entry)
    if "train_loss_key" in settings and settings["train_loss_key"] is None:
        settings["train_loss_key"] = cfg.protocol.strategy_slot.loss_key
    takes = inspect.signature(get_object(settings["_target_"])).parameters
    strategy = instantiate(settings, _partial_=True, **args)(
        **plan.strategy_args(takes)
    )  # as objects, not configs
    if he is not None or (slot and plan.he):
        return instantiate(plan.he_wrapper(**(he or {})), strategy=strategy)
    if not (slot and cfg.privacy.wrapper):
        return strategy
    wrapper = schema_entry(cfg.privacy.wrapper)
    if "num_sampled_clients" in wrapper and wrapper["num_sampled_clients"] is None:
        wrapper["num_sampled_clients"] = sampled(strategy, clients)
    wrapped = instantiate(wrapper, strategy=strategy)
    if not isinstance(wrapped, dp_wrappers()):  # the class decides, as schema.check_privacy does
        return wrapped
    return NumpyNoise(wrapped, plan.noise, plan.central.open(account(wrapped, float(plan.delta))))


def sampled(strategy, clients: int) -> int:
    """How many of ``clients`` a FedAvg-style strategy samples per round (Flower's
    ``FedAvg.configure_train``): the n of a DP wrapper's noise."""
    return max(int(clients * strategy.fraction_train), strategy.min_train_nodes)


def over_select(strategy: Strategy, clock: VirtualClock | None, clients: int) -> int:
    """Make a FedAvg-style ``strategy`` sample ``clock.over_selection`` times the clients it
    would of ``clients`` (:func:`sampled`), rounded up and at most ``clients``, so that the
    clock's quota (the sampled count over the factor, rounded down) is what it sampled before;
    the clients a round needs online to start. The count is set as the strategy's minimum:
    Flower truncates ``fraction x clients``, and 1.5 x 3 sampled 4, whose quota is 2, not 3."""
    if not hasattr(strategy, "min_train_nodes"):
        return 1
    factor = 1.0 if clock is None else clock.over_selection
    before = sampled(strategy, clients)
    strategy.fraction_train = min(1.0, strategy.fraction_train * factor)
    strategy.min_train_nodes = min(clients, math.ceil(before * factor - 1e-9))
    return max(strategy.min_train_nodes, getattr(strategy, "min_available_nodes", 1))


def innermost(strategy: Strategy) -> Strategy:
    """The strategy inside every wrapper (privacy, HE, client spread): where a method reads
    what its own strategy records (alphas, releases)."""
    while hasattr(strategy, "strategy"):
        strategy = strategy.strategy
    return strategy


@dataclass
class RunContext:
    """What a method runner needs: messenger, config, nodes by partition and their info, the
    run's privacy plan."""

    messenger: Messenger
    cfg: DictConfig
    base: dict  # the config entries every client message carries
    nodes: dict[int, int]  # partition id -> node id
    info: dict[int, dict]  # partition id -> the node's discovery info
    plan: PrivacyPlan = field(kw_only=True)  # the ServerApp's (fedsim/privacy/plan.py)

    def partition_of(self, node: int) -> int:
        return self._partitions[node]

    @cached_property
    def _partitions(self) -> dict[int, int]:
        """Node id -> partition (``nodes`` inverted once: a round asks it for every reply)."""
        return {n: partition_id for partition_id, n in self.nodes.items()}

    def grid(self, label: str, policy: Policy | None = None, need: int = 1):
        """A Grid over every client in partition order. Flower samples nodes by position and
        node ids are random per run, so this order makes the same seed sample the same clients
        in every run. Under a virtual clock a round starts once ``need`` clients are online."""
        return self.messenger.grid(
            label, policy or Policy(ANY), [self.nodes[p] for p in sorted(self.nodes)], need
        )

    def clock_grid(self, label: str, policy: Policy, strategy: Strategy):
        """:meth:`grid` for a FedAvg-style ``strategy`` (sampling by ``fraction_train`` and
        ``min_train_nodes``): under a virtual clock the strategy samples ``clock.over_selection``
        times as many clients, and a round starts once as many as it needs are online
        (:func:`over_select`); without the clock's quorum Flower's sampling would wait forever
        for clients the clock keeps offline."""
        need = over_select(innermost(strategy), self.messenger.clock, len(self.nodes))
        return self.grid(label, policy, need)

    def declared(self, key: str) -> Callable[[int], float]:
        """What each node declared at discovery under ``key`` (its examples): the bound of its
        replies' weight."""
        return lambda node: float(self.info[self.partition_of(node)][key])

    def fedavg(
        self,
        label: str,
        initial: ArrayRecord,
        rounds: int,
        config: dict,
        fraction_train: float,
        reply: Callable[[ArrayRecord], Validator],
        entry=None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        **strategy_args,
    ) -> Result:
        """A weight-averaging strategy (``entry``; None: the experiment's slot, ``build_strategy``)
        with ``strategy_args`` over ``fraction_train`` of the clients per round; replies must be
        ``reply(initial)`` (the model's arrays, a weight within the node's declaration), a round
        goes on with any of them. ``evaluate_fn``: Flower's server-side evaluation, before round
        1 and after each round. Under a virtual clock the strategy samples ``clock.over_selection``
        times as many clients (:func:`over_select`)."""
        strategy = build_strategy(
            self.cfg,
            self.plan,
            len(self.nodes),
            entry,
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
            **strategy_args,
        )
        return strategy.start(
            self.clock_grid(label, Policy(ANY, reply(initial)), strategy),
            initial,
            rounds,
            self.cfg.round_timeout,
            ConfigRecord(config),
            evaluate_fn=evaluate_fn,
        )


def discover(
    messenger: Messenger, base: dict, reply: Validator | None = None
) -> tuple[dict[int, int], dict[int, ConfigRecord]]:
    """Every node's discovery reply (quorum: all; a method needs every client), by partition:
    node ids and the INFO record of each. Each must be ``reply`` (the method's declaration,
    ``fedsim.runtime.validators.discovery_reply``). A node's partition is the one it told at ``whoami``
    (the Messenger's map, which ``reply`` holds its INFO to); only where the Messenger did not ask
    (a protocol driven without the ServerApp) is it the reply's claim. A partition two nodes
    claim is refused to both (``duplicate``): neither takes the other's place."""

    def claim(content: RecordDict) -> int:
        return int(content[INFO][PARTITION_ID])

    replies = messenger.exchange(
        "discover",
        [
            Message(
                RecordDict({CONFIG: ConfigRecord(base)}),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in messenger.node_ids()
        ],
        Policy(validator=reply, claim=claim),
    )
    nodes, info = {}, {}
    for msg in replies:
        node = msg.metadata.src_node_id
        partition_id = messenger.partition_of(node)
        partition_id = claim(msg.content) if partition_id is None else partition_id
        nodes[partition_id], info[partition_id] = node, msg.content[INFO]
    return nodes, info


def base_line(sft: dict) -> str:
    """One line on how a base language model was made (``fedsim_tasks.causal_lm.saved_sft_base``)."""
    if not sft.get("steps"):
        return "Base: the model as published (no SFT)."
    return (
        f"Base: SFT on {sft['data']}, held-out nll {sft['heldout_nll_before']:.3f} -> "
        f"{sft['heldout_nll']:.3f}."
    )
