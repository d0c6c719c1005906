"""FedDTRE's message format: the record and config keys that the protocol
(``fedsim_experiments/feddtre/protocol.py``), its strategies (``fedsim_strategies/trust_alpha.py``: the mixing keys,
defined in ``fedsim.trust_mixing``; Flower's FedProx: ``proximal-mu``, read by
``fedsim_tasks/proximal.py`` in every client that trains) and the client
(``fedsim_clients/dialogue.py``) exchange, and what each phase's reply must be."""

import math
from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord

from fedsim.message_keys import *  # noqa: F403 (the shared keys, re-exported: both ends read every key here)
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.runtime.validators import Arrays, Bound, Metrics, Number, Reply, discovery_reply, weight
from fedsim.trust_mixing import (  # noqa: F401 (the mixing's keys, re-exported)
    ALPHA,
    HELDOUT_NLL,
    MIXING,
    S_GAP_SE,
    S_GLOBAL,
    S_LOCAL,
    SCORED,
    TRAIN_NLL,
)
from fedsim_tasks.dialogue.metrics import REPLY_METRICS, REPLY_RANGES

# the shared keys as FedDTRE uses them: ARRAYS the adapters / evaluator weights to train (train) or
# trained (reply); NUM_EXAMPLES the client's training examples (FedAvg's weight); LR the evaluator's
# (the generator's is in SETTINGS, per round); SERVER_ROUND seeds the local shuffle and scoring
# sample; LOCAL_MODEL (generator) the name under which a mixing client keeps its own W_local;
# STATE_BYTES the state mixing clients keep

EXAMPLES_PREFIX = (
    "examples-"  # INFO: "examples-<dataset>", the client's training examples per dataset
)

# OBJECTIVE (config, train): what to train, one of:
EVALUATOR = "evaluator"  #   the trust evaluator on the client's trust data (FedAvg)
GENERATOR = "generator"  #   the generator's adapters on one dataset (FedAvg, FedProx, alpha mixing)
DATASET = "dataset"  # config (generator): which dataset of the task
SETTINGS = "settings"  # config (generator): JSON of the generator settings (base, LoRA, decoding)
EVALUATOR_WEIGHTS = (
    "evaluator-weights"  # config (trust mixing): the trained evaluator's weights (.npz bytes)
)
DP_ACCOUNT = (
    "dp-account"  # config (generator): whose DP-SGD budget the steps spend (dataset / method)
)
DP_EPSILON_METHOD = (
    "dp-epsilon-method"  # metric (generator): DP-SGD epsilon of this account's trainings alone
)

# evaluate message after a generator method's rounds: the client's personalized model (its kept
# LOCAL_MODEL, else the global model in ARRAYS) and the global model on its own held-out contexts;
# the config carries DATASET, SETTINGS, LOCAL_MODEL, EVALUATOR_WEIGHTS, SEED and SERVER_ROUND
# (the round after the last: the newest kept W_local is read)
PERSONAL_CONTEXTS = (
    "personal-contexts"  # config (evaluate): held-out contexts of the client sampled (seeded)
)
PERSONAL = "personal/"  # METRICS prefix (evaluate): "personal/<metric>", the personalized model's
GLOBAL = "global/"  # METRICS prefix (evaluate): "global/<metric>", the global model's on the same contexts
KEPT_LOCAL = (
    "kept-local"  # METRICS (evaluate): 1 if the client had its own W_local, 0 if it used the global
)
DISTANCE = "distance-to-global"  # METRICS (evaluate): ||W_personal - W_global|| / ||W_global|| (0: the global itself)
CONTEXTS = "contexts"  # METRICS (evaluate): contexts scored


# --- what each phase's reply must be (checked in the Messenger's screen: fedsim/runtime/validators.py) --


def discover_reply(
    partition_of: Callable[[int], int | None],
    datasets: list[str],
    expected: Callable[[int], dict[str, int]] | None,
    partitions: int,
) -> Reply:
    """Who a client is: its partition (the one it told at ``whoami``, where known) and its
    training examples of every dataset, exactly those the public partitioning gives that
    partition (``expected``, where the server computes them)."""

    def check(info: ConfigRecord, partition: int) -> str | None:
        want = None if expected is None else expected(partition)
        return (
            None
            if want is None or all(info[EXAMPLES_PREFIX + d] == n for d, n in want.items())
            else "not the examples its partition holds"
        )

    examples = {EXAMPLES_PREFIX + d: weight(math.inf, low=0) for d in datasets}
    return discovery_reply(partition_of, partitions, examples, check)


TRUST = Number(*REPLY_RANGES["trust_bertscore"])  # a trust score: a BERTScore F1


def train_reply(
    sent: ArrayRecord,
    examples: Bound,
    loss_key: str | None,
    mixing: bool = False,
    trust: int = 0,
    loss_gap: bool = False,
) -> Reply:
    """Trained weights (the evaluator's, a generator's adapters): the arrays of the model ``sent``,
    the client's examples (FedAvg's weight, at most ``examples``: what it declared), the loss a
    loss-weighted strategy reads; under a ``mixing`` its alpha in [0, 1], with ``trust`` scoring
    contexts the two trust scores it came from, the standard error of their difference and
    exactly ``trust`` contexts scored (the run checked that every client holds them), with
    ``loss_gap`` its local model's train and held-out nll."""
    required = (
        {NUM_EXAMPLES: weight(examples)}
        | ({loss_key: Number()} if loss_key else {})
        | ({ALPHA: Number(0.0, 1.0)} if mixing else {})
        | (
            {
                S_LOCAL: TRUST,
                S_GLOBAL: TRUST,
                S_GAP_SE: Number(0.0, 2.0),
                SCORED: Number(trust, trust, whole=True),
            }
            if trust
            else {}
        )
        | ({TRAIN_NLL: Number(0.0), HELDOUT_NLL: Number(0.0)} if mixing and loss_gap else {})
    )
    return Reply({ARRAYS: Arrays(sent), METRICS: Metrics(required)})


MAX_DISTANCE = (
    1e6  # ||W_personal - W_global|| / ||W_global|| beyond this is no model of this federation
)


def personal_reply() -> Reply:
    """A client's personalized evaluation: whether it kept a model of its own, its distance to the
    global one, the contexts scored, and every reply metric of both models, each in its range."""
    scores = {
        prefix + m: Number(*REPLY_RANGES[m]) for prefix in (PERSONAL, GLOBAL) for m in REPLY_METRICS
    }
    return Reply(
        {
            METRICS: Metrics(
                {
                    KEPT_LOCAL: Number(0, 1, whole=True),
                    DISTANCE: Number(0.0, MAX_DISTANCE),
                    CONTEXTS: Number(0, whole=True),
                    **scores,
                }
            )
        }
    )
