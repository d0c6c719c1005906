"""Train-config values that change by round, around any Flower strategy.

Flower's ``Strategy.start`` sends one ``train_config`` every round (the message-API strategies
have no per-round config function), so a setting scheduled by round, such as the learning rate
that matches an anchoring control's per-round update size to another method's
(``fedsim_experiments/fede4rag/protocol.py``), needs this wrapper: each round's config is the one
given with that round's values put over it. Sampling, weighting and aggregation stay the
wrapped strategy's.
"""

from __future__ import annotations

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import Strategy

from fedsim_strategies.wrapper import StrategyWrapper


class RoundConfig(StrategyWrapper):
    """``strategy`` with ``schedule[round]`` (key -> value) put over the train config of that
    round; a round the schedule does not name gets the config as given."""

    def __init__(self, strategy: Strategy, schedule: dict[int, dict]):
        self.strategy, self.schedule = strategy, schedule

    def configure_train(self, server_round, arrays, config, grid):
        config = ConfigRecord({**config, **self.schedule.get(server_round, {})})
        return self.strategy.configure_train(server_round, arrays, config, grid)
