"""FedBis / FedBiscuit's message format: the record and config keys that the protocol
(``fedsim_experiments/fedbiscuit.py``), the strategy it configures (``fedsim_strategies/selector_groups.py``
takes them as arguments, like Flower's FedAvg) and the client (``fedsim_clients/preference.py``)
exchange."""

CONFIG = "config"                # ConfigRecord of every message
ARRAYS = "arrays"                # ArrayRecord: the weights to train (train) / trained (reply)
METRICS = "metrics"              # MetricRecord of replies
NUM_EXAMPLES = "num-examples"    # METRICS: the client's training examples (data-share FedAvg / eq. 6 weight)
UNIT_WEIGHT = "unit-weight"      # METRICS: 1 in every reply (uniform p_m = 1/M: the public code's ignore_weight)
MODEL_PREFIX = "model-"          # ArrayRecords "model-<u>" of a regroup request: every selector
LOSS_PREFIX = "loss-"            # METRICS "loss-<u>" of a regroup reply: validation loss on selector u
GROUP = "group"                  # config (train): the selector the client trains (FedBiscuit)

INFO = "info"                    # ConfigRecord of the discovery (query) reply ...
PARTITION_ID = "partition-id"    # ... the node's partition
NUM_VALID = "num-valid"          # ... its validation examples
POPULATION = "population"        # ... majority | minority (simulation ground truth, for reporting only)

OBJECTIVE = "objective"          # config (train): what to train, one of:
SELECTOR = "selector"            #   the binary selector on the client's pairs (cross-entropy)
SFT = "sft"                      #   the policy on the client's preferred responses (FedAvg baseline)
DPO = "dpo"                      #   the policy by DPO on the client's pairs (FedDPO baseline)
LOCAL_STEPS = "local-steps"      # config (train): optimizer steps
BATCH_SIZE = "batch-size"        # config (train): examples per step
LR = "lr"                        # config (train): learning rate
WEIGHT_DECAY = "weight-decay"    # config (train): L2 penalty (selector)
POLICY_BASE = "policy-base"      # config (SFT / DPO): folder of the shared base policy
POLICY = "policy"                # config (SFT / DPO): the policy settings (JSON of experiments' RLHF)
SEED = "seed"                    # config (train): the run's seed
SERVER_ROUND = "server-round"    # config (train): the round (seeds the local shuffle)
TORCH_THREADS = "torch-threads"  # config: torch threads for this message's work
