"""Turn sentiment's client: one local epoch of the workload's MLP on its slice of turns
(``fedsim_tasks/topical_chat/turn_sentiment.py``), the weights and its examples back."""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedsim.runtime import hosted_work
from fedsim_clients import turn_sentiment_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.proximal import proximal_mu
from fedsim_tasks.topical_chat.turn_sentiment import WEIGHT_NAMES, Recipe, count_turns


class TurnSentimentClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        super().__init__(task, data_root, partition_id, num_partitions)
        self.recipe = Recipe.of(task, data_root)

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        """Natural number of clients: one per training turn."""
        recipe = Recipe.of(task, data_root)
        return count_turns(recipe.data_root, recipe.train_splits)

    def discover(self) -> dict:
        return {keys.NUM_EXAMPLES: self.recipe.examples(self.partition_id, self.num_partitions)}

    def train(self, msg: Message) -> RecordDict:
        self.threads(msg.content[keys.CONFIG])
        weights, examples, loss = hosted_work.result(self.partition_id, msg, self.epochs)
        return self.weights_reply(
            dict(zip(WEIGHT_NAMES, weights)),
            {keys.NUM_EXAMPLES: examples, keys.TRAIN_LOSS: loss},
        )

    def epochs(self, msg: Message, partitions: list[int]) -> list[tuple[list, int, float]]:
        """The epochs ``msg`` asks of each of ``partitions`` (this client's and, under the
        batched backend, its peers', ``fedsim/runtime/hosted_work.py``): one client's as
        :meth:`Recipe.local_update`, several as one batched computation."""
        config = msg.content[keys.CONFIG]
        sent = self.weights(msg)
        weights = [sent[name] for name in WEIGHT_NAMES]
        args = (self.num_partitions, int(config[keys.SEED]), self.server_round(config))
        if len(partitions) == 1:
            new, examples, stats = self.recipe.local_update(
                weights, partitions[0], *args, proximal_mu(config)
            )
            return [(new, examples, stats["loss"])]
        stacked, examples, losses = self.recipe.local_updates(
            weights, partitions, *args, proximal_mu(config)
        )
        rows = [[w[c] for w in stacked] for c in range(len(partitions))]
        return list(zip(rows, examples, losses))
