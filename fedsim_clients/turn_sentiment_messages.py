"""Turn sentiment's message format: what the protocol (``fedsim_experiments/turn_sentiment/protocol.py``)
and the client (``fedsim_clients/turn_sentiment.py``) exchange; only the shared keys
(``fedsim/message_keys.py``): the weights under ARRAYS, NUM_EXAMPLES in METRICS and INFO."""

import math
from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord

from fedsim.message_keys import *  # noqa: F403 (the shared keys, re-exported: both ends read every key here)
from fedsim.message_keys import NUM_EXAMPLES
from fedsim.runtime.validators import (
    Bound,
    Metrics,
    Number,
    Reply,
    discovery_reply,
    model_reply,
    weight,
)

TRAIN_LOSS = "train-loss"  # METRICS (train): the client's mean loss over its epoch


def discover_reply(
    partition_of: Callable[[int], int | None], examples: Callable[[int], int], partitions: int
) -> Reply:
    """Who a client is: its partition and exactly the turns the public partitioning gives it."""

    def check(info: ConfigRecord, partition: int) -> str | None:
        return (
            None
            if info[NUM_EXAMPLES] == examples(partition)
            else "not the turns its partition holds"
        )

    return discovery_reply(partition_of, partitions, {NUM_EXAMPLES: weight(math.inf)}, check)


def train_reply(sent: ArrayRecord, examples: Bound) -> Reply:
    """A trained MLP: the arrays of the model ``sent``, its examples at most what it declared."""
    return model_reply(sent, Metrics({NUM_EXAMPLES: weight(examples), TRAIN_LOSS: Number()}))
