"""A strategy around another, for the wrappers that change one or two of its steps.

Flower's message-API ``Strategy`` is abstract in every step and ships no delegating base (each
of its DP wrappers writes the delegation out), so fedsim's wrappers share this one.
"""

from __future__ import annotations

from flwr.serverapp.strategy import Strategy


class StrategyWrapper(Strategy):
    """Every step is ``self.strategy``'s; a subclass overrides only the steps it changes."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round, arrays, config, grid):
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        return self.strategy.aggregate_evaluate(server_round, replies)
