"""FedDTRE's message format: the record and config keys that the protocol
(``fedsim_experiments/feddtre.py``), its strategies (``fedsim_strategies/trust_alpha.py``: the mixing keys,
defined in ``fedsim.trust_mixing``; Flower's FedProx: ``proximal-mu``, read by
``fedsim_tasks/proximal.py`` in every client that trains) and the client
(``fedsim_clients/dialogue.py``) exchange."""

from fedsim.trust_mixing import ALPHA, MIXING, S_GLOBAL, S_LOCAL  # noqa: F401 (the mixing's keys)

CONFIG = "config"                # ConfigRecord of every message
ARRAYS = "arrays"                # ArrayRecord: adapters / evaluator weights to train (train) or trained (reply)
METRICS = "metrics"              # MetricRecord of replies
NUM_EXAMPLES = "num-examples"    # METRICS: the client's training examples (FedAvg's weight)

INFO = "info"                    # ConfigRecord of the discovery (query) reply ...
PARTITION_ID = "partition-id"    # ... the node's partition
EXAMPLES_PREFIX = "examples-"    # ... "examples-<dataset>": its training examples per dataset

OBJECTIVE = "objective"          # config (train): what to train, one of:
EVALUATOR = "evaluator"          #   the trust evaluator on the client's trust data (FedAvg)
GENERATOR = "generator"          #   the generator's adapters on one dataset (FedAvg, FedProx, alpha mixing)
DATASET = "dataset"              # config (generator): which dataset of the task
SETTINGS = "settings"            # config (generator): JSON of the generator settings (base, LoRA, decoding)
LOCAL_MODEL = "local-model"      # config (generator): the name under which a mixing client keeps its own W_local
STATE_BYTES = "state-bytes"      # METRICS: bytes of the client's kept state on its disk (mixing clients)
EVALUATOR_WEIGHTS = "evaluator-weights"  # config (trust mixing): the trained evaluator's weights (.npz bytes)
LOCAL_STEPS = "local-steps"      # config (train): optimizer steps
BATCH_SIZE = "batch-size"        # config (train): examples per step
LR = "lr"                        # config (evaluator): learning rate (the generator's is in SETTINGS, per round)
SEED = "seed"                    # config (train): the run's seed
SERVER_ROUND = "server-round"    # config (train): the round (seeds the local shuffle and scoring sample)
TORCH_THREADS = "torch-threads"  # config: torch threads for this message's work
DP_ACCOUNT = "dp-account"        # config (generator): whose DP-SGD budget the steps spend (dataset / method)
DP_EPSILON_METHOD = "dp-epsilon-method"  # metric (generator): DP-SGD epsilon of this account's trainings alone

# evaluate message after a generator method's rounds: the client's personalized model (its kept
# LOCAL_MODEL, else the global model in ARRAYS) and the global model on its own held-out contexts;
# the config carries DATASET, SETTINGS, LOCAL_MODEL, EVALUATOR_WEIGHTS, SEED and SERVER_ROUND
# (the round after the last: the newest kept W_local is read)
PERSONAL_CONTEXTS = "personal-contexts"  # config (evaluate): held-out contexts of the client sampled (seeded)
PERSONAL = "personal/"           # METRICS prefix (evaluate): "personal/<metric>", the personalized model's
GLOBAL = "global/"               # METRICS prefix (evaluate): "global/<metric>", the global model's on the same contexts
KEPT_LOCAL = "kept-local"        # METRICS (evaluate): 1 if the client had its own W_local, 0 if it used the global
DISTANCE = "distance-to-global"  # METRICS (evaluate): ||W_personal - W_global|| / ||W_global|| (0: the global itself)
CONTEXTS = "contexts"            # METRICS (evaluate): contexts scored
