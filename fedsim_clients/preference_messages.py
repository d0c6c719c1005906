"""FedBis / FedBiscuit's message format: the record and config keys that the protocol
(``fedsim_experiments/fedbiscuit/protocol.py``), the strategy it configures (``fedsim_strategies/selector_groups.py``
takes them as arguments, like Flower's FedAvg) and the client (``fedsim_clients/preference.py``)
exchange, and what each phase's reply must be."""

import math
from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord

from fedsim.message_keys import *  # noqa: F403 (the shared keys, re-exported: both ends read every key here)
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.runtime.validators import (
    Arrays,
    Bound,
    Metrics,
    Number,
    Reply,
    Text,
    Validator,
    discovery_reply,
    weight,
)

# the shared keys as FedBis / FedBiscuit use them: NUM_EXAMPLES the client's training examples
# (data-share FedAvg / eq. 6 weight; in INFO what it declares at discovery)

UNIT_WEIGHT = (
    "unit-weight"  # METRICS: 1 in every reply (uniform p_m = 1/M: the public code's ignore_weight)
)
MODEL_PREFIX = "model-"  # ArrayRecords "model-<u>" of a regroup request: every selector
LOSS_PREFIX = "loss-"  # METRICS "loss-<u>" of a regroup reply: validation loss on selector u
GROUP = "group"  # config (train): the selector the client trains (FedBiscuit)

NUM_VALID = "num-valid"  # INFO: the client's validation examples
POPULATION = "population"  # ... majority | minority (simulation ground truth, for reporting only)
POPULATIONS = ("majority", "minority")

# OBJECTIVE (config, train): what to train, one of:
SELECTOR = "selector"  #   the binary selector on the client's pairs (cross-entropy)
SFT = "sft"  #   the policy on the client's preferred responses (FedAvg baseline)
DPO = "dpo"  #   the policy by DPO on the client's pairs (FedDPO baseline)
WEIGHT_DECAY = "weight-decay"  # config (train): L2 penalty (selector)
POLICY_BASE = "policy-base"  # config (SFT / DPO): folder of the shared base policy
POLICY = "policy"  # config (SFT / DPO): the policy settings (JSON of experiments' RLHF)


# --- what each phase's reply must be (checked in the Messenger's screen: fedsim/runtime/validators.py) --


def discover_reply(
    partition_of: Callable[[int], int | None],
    expected: Callable[[int], dict] | None,
    partitions: int,
) -> Reply:
    """Who a client is: its partition (the one it told at ``whoami``, where known) and exactly
    the data sizes and population the public partitioning gives that partition (``expected``,
    where the server computes them)."""

    def check(info: ConfigRecord, partition: int) -> str | None:
        want = None if expected is None else expected(partition)
        return (
            None
            if want is None or all(info[k] == v for k, v in want.items())
            else "not the data its partition holds"
        )

    return discovery_reply(
        partition_of,
        partitions,
        {
            NUM_EXAMPLES: weight(math.inf),
            NUM_VALID: Number(0, whole=True),
            POPULATION: Text(choices=POPULATIONS),
        },
        check,
    )


def train_reply(sent: ArrayRecord, examples: Bound, loss_key: str | None) -> Reply:
    """A trained selector or policy: the arrays of the model ``sent``, the client's examples (the
    data-share weight, at most what it declared), 1 as the uniform weight, and the loss a
    loss-weighted strategy reads."""
    required = {NUM_EXAMPLES: weight(examples), UNIT_WEIGHT: Number(1, 1)} | (
        {loss_key: Number()} if loss_key else {}
    )
    return Reply({ARRAYS: Arrays(sent), METRICS: Metrics(required)})


def report_weight(examples: Bound) -> Validator:
    """A regroup report's weights: its examples at most what it declared, 1 as the uniform one
    (``SelectorGroups`` checks the losses)."""
    weights = Metrics({NUM_EXAMPLES: weight(examples), UNIT_WEIGHT: Number(1, 1)})
    return lambda content, node: weights.problem(content[METRICS], node)
