"""FedBuff and FedAsync: asynchronous FL on the run's virtual clock, in simulation.

Nothing waits for a round. At a server step (the start, then each model update) the server
dispatches the current model to idle clients online at that virtual time, enough to keep
``concurrency`` in flight (FedScale's asynchronous mode dispatches the same way, per step); their
training runs at once, through the run's one messaging path, and the clock says when each update
arrives (``fedsim/clock/schedule.py``: its examples, bytes, speed, bandwidth, availability).
Updates are then taken in order of arrival:

- ``FedBuff`` (Nguyen et al., 2022) buffers ``buffer_size`` updates, each the client's weights
  minus the model it was sent, scaled by ``(1 + staleness) ** -staleness_exponent`` (the paper:
  0.5), and steps the model by ``server_lr`` times their mean;
- ``FedAsync`` (Xie et al., 2019) mixes each update in as it arrives,
  ``w <- (1 - a) w + a w_client`` with ``a = mixing * (1 + staleness) ** -staleness_exponent``
  (its polynomial staleness function).

``staleness`` is how many model updates happened since the client's model was sent; one older
than ``max_staleness`` is a straggler, left out and counted; a client that goes offline before
its update would arrive is a dropout. ``num_rounds`` counts model updates; each is logged on the
clock (``results.json``'s ``clock.rounds``, with each update's ``virtual_finish`` and staleness),
and ``evaluate_fn`` runs after each. Which clients are dispatched is drawn with Flower's node
sampler (seeded from the run's seed, ``fedsim/runtime/server_app.py``): the same seed gives the
same schedule and the same model. Written here because Flower has no asynchronous strategy
(its FedAsync pull request is open); the loop is the clock's, the messaging fedsim's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedsim.clock.schedule import ACCEPTED, DROPOUT, STRAGGLER, ClockError
from fedsim.flower.strategies import strategy_utils
from fedsim.message_keys import SERVER_ROUND
from fedsim.runtime.messaging import PhaseGrid
from fedsim.runtime.records import from_record, to_record

Weights = dict[str, np.ndarray]


class Asynchronous(FedAvg):
    """The event loop both strategies share; a subclass says how an update moves the model."""

    def __init__(
        self,
        concurrency: int = 10,
        staleness_exponent: float = 0.5,
        max_staleness: int | None = None,
        **fedavg,
    ):
        super().__init__(**fedavg)
        if (
            concurrency < 1
            or staleness_exponent < 0
            or (max_staleness is not None and max_staleness < 0)
        ):
            raise ValueError(
                f"concurrency must be >= 1, staleness_exponent >= 0 and max_staleness >= 0 or "
                f"None, got {concurrency}, {staleness_exponent}, {max_staleness}"
            )
        self.concurrency = concurrency
        self.staleness_exponent = staleness_exponent
        self.max_staleness = max_staleness

    def scale(self, staleness: int) -> float:
        return float((1 + staleness) ** -self.staleness_exponent)

    def take(
        self, weights: Weights, sent: Weights, update: Weights, staleness: int
    ) -> Weights | None:
        """Take one arrived update; the new model when this update makes a server step, else None."""
        raise NotImplementedError

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        clock = grid.messenger.clock if isinstance(grid, PhaseGrid) else None
        if clock is None:
            raise ValueError(
                f"{type(self).__name__} runs on the virtual clock (clock=synthetic or clock=trace)"
            )
        loop = _Loop(self, grid, clock, train_config or ConfigRecord(), timeout)
        result = Result()
        if evaluate_fn and (res := evaluate_fn(0, initial_arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = res
        weights = from_record(initial_arrays)
        loop.models[0] = weights
        for version in range(1, num_rounds + 1):
            weights = loop.step(version, weights)
            result.arrays = to_record(weights)
            if evaluate_fn and (res := evaluate_fn(version, result.arrays)) is not None:
                result.evaluate_metrics_serverapp[version] = res
        return result


class _Loop:
    """The in-flight clients of an asynchronous run, in order of their updates' arrival."""

    def __init__(
        self, strategy: Asynchronous, grid: PhaseGrid, clock, config: ConfigRecord, timeout: float
    ):
        self.strategy, self.grid, self.clock, self.config, self.timeout = (
            strategy,
            grid,
            clock,
            config,
            timeout,
        )
        self.phase = f"{grid.label}/{MessageType.TRAIN}"
        self.nodes = {grid.messenger.partition_of(n): n for n in grid.population()}
        self.in_flight: list[tuple] = []  # (arrival, partition, version sent, weights or None)
        self.models: dict[int, Weights] = {}  # the models clients in flight were sent, by version

    def dispatch(self, version: int, weights: Weights) -> None:
        """Send ``weights`` (model ``version``) to idle online clients up to the concurrency;
        with none in flight and none online, wait for one to come online."""
        busy = {p for _, p, _, _ in self.in_flight}
        idle = [p for p in sorted(self.nodes) if p not in busy]
        free = self.strategy.concurrency - len(self.in_flight)
        if free <= 0 or not idle:
            return
        online = self.clock.online(idle) if self.in_flight else self.clock.wait_for(idle, 1)
        chosen = sorted(strategy_utils.random.sample(online, min(free, len(online))))
        if not chosen:
            return
        config = ConfigRecord(dict(self.config))
        config[SERVER_ROUND] = version + 1
        record = RecordDict(
            {
                self.strategy.arrayrecord_key: to_record(weights),
                self.strategy.configrecord_key: config,
            }
        )
        messages = list(
            self.strategy._construct_messages(
                record, [self.nodes[p] for p in chosen], MessageType.TRAIN
            )
        )
        down = self.grid.bytes_down(messages)
        replies = self.grid.dispatch(messages, version + 1, self.timeout)
        self.models[version] = weights
        for task, reply in zip(self.grid.tasks(down, replies), replies):
            arrival, stays = self.clock.finish(task, self.clock.now)
            update = from_record(reply.content[self.strategy.arrayrecord_key]) if stays else None
            heapq.heappush(self.in_flight, (arrival, task.partition, version, update))

    def step(self, version: int, weights: Weights) -> Weights:
        """Take arrivals until one makes model ``version``; log the step on the clock."""
        start, seen = self.clock.now, []
        self.dispatch(version - 1, weights)
        new = None
        while new is None:
            if not self.in_flight:
                raise ClockError(f"{self.phase}: no client in flight for model {version}")
            arrival, partition, sent, update = heapq.heappop(self.in_flight)
            self.clock.now = max(self.clock.now, arrival)
            staleness = version - 1 - sent
            if update is None:
                seen.append((partition, None, DROPOUT, staleness))
            elif (
                self.strategy.max_staleness is not None and staleness > self.strategy.max_staleness
            ):
                seen.append((partition, arrival, STRAGGLER, staleness))
            else:
                seen.append((partition, arrival, ACCEPTED, staleness))
                new = self.strategy.take(weights, self.models[sent], update, staleness)
            self._forget_models()
            if new is None and not self.in_flight:
                self.dispatch(version - 1, weights)
        entry = self.clock.log(self.phase, version, start, seen)
        self.grid.messenger.count(
            self.phase, version, stragglers=entry["stragglers"], dropouts=entry["dropouts"]
        )
        return new

    def _forget_models(self) -> None:
        keep = {sent for _, _, sent, _ in self.in_flight}
        for version in [v for v in self.models if v not in keep]:
            del self.models[version]


class FedBuff(Asynchronous):
    """Buffered asynchronous aggregation: a server step every ``buffer_size`` updates."""

    def __init__(self, buffer_size: int = 10, server_lr: float = 1.0, **asynchronous):
        super().__init__(**asynchronous)
        if buffer_size < 1 or server_lr <= 0:
            raise ValueError(
                f"buffer_size must be >= 1 and server_lr > 0, got {buffer_size}, {server_lr}"
            )
        self.buffer_size, self.server_lr = buffer_size, server_lr
        self.buffer: list[Weights] = []

    def take(
        self, weights: Weights, sent: Weights, update: Weights, staleness: int
    ) -> Weights | None:
        scale = self.scale(staleness)
        self.buffer.append({k: scale * (update[k] - sent[k]) for k in weights})
        if len(self.buffer) < self.buffer_size:
            return None
        step = {k: self.server_lr * np.mean([d[k] for d in self.buffer], axis=0) for k in weights}
        self.buffer = []
        return {k: (weights[k] + step[k]).astype(weights[k].dtype) for k in weights}


class FedAsync(Asynchronous):
    """Asynchronous mixing: every update makes a server step."""

    def __init__(self, mixing: float = 0.5, **asynchronous):
        super().__init__(**asynchronous)
        if not 0 < mixing <= 1:
            raise ValueError(f"mixing must be in (0, 1], got {mixing}")
        self.mixing = mixing

    def take(self, weights: Weights, sent: Weights, update: Weights, staleness: int) -> Weights:
        a = self.mixing * self.scale(staleness)
        return {k: ((1 - a) * weights[k] + a * update[k]).astype(weights[k].dtype) for k in weights}
