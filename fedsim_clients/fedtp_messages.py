"""FedTP's message format: the record and config keys that the protocol
(``fedsim_experiments/fedtp.py``) and the client (``fedsim_clients/topic_preference.py``) exchange."""

CONFIG = "config"                  # ConfigRecord of every message
SPLITS = "splits"                  # config: the conversations (splits) the message is about
TURN_LEVEL = "turn-level"          # config (evaluate): also return per-turn outcomes
VARIANT_NAMES = "variant-names"    # config (evaluate): router variants to score ...
VARIANT_PRIORS = "variant-priors"  # ... the prior each uses (a key of PRIORS, "" for none)
VARIANT_ALPHAS = "variant-alphas"  # ... its FedMix global weight
VARIANT_LAMBDAS = "variant-lambdas"  # ... its prior weight lambda
PRIORS = "priors"                  # ArrayRecord (evaluate): released priors by name
ARRAYS = "arrays"                  # ArrayRecord of a train reply
VECTORS = "vectors"                # ARRAYS entry: (clients hosted, topics) preference rows
METRICS = "metrics"                # MetricRecord of train / evaluate replies
NUM_EXAMPLES = "num-examples"      # METRICS: clients (train) or turns (evaluate) covered
TURN_PREFIX = "turn/"              # METRICS keys with per-turn lists
INFO = "info"                      # ConfigRecord of the discovery (query) reply
INFO_SPLITS = "splits"             # INFO: the split of each hosted conversation
INFO_ROWS = "rows"                 # INFO: the population row of each hosted conversation
