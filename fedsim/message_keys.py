"""The message keys more than one module writes or reads, declared here once: the core (the
ClientApp, the Messenger, the journal, HE), the strategies, the clients and each method's
message format (``fedsim_clients/*_messages.py``, which import this block) use these names, so
both ends of a message spell a key the same way. No Flower here: the tasks layer imports it.
The strings are the wire format: journals and results written before keep their meaning."""

# records of a message
CONFIG = "config"  # ConfigRecord of every message
ARRAYS = "arrays"  # ArrayRecord: the weights to train (train) / trained (reply)
METRICS = "metrics"  # MetricRecord of replies
INFO = "info"  # ConfigRecord of a discovery (query) reply

# entries every method's messages carry
PARTITION_ID = "partition-id"  # the node's partition: INFO of a discovery reply, the whoami reply
RAY_NODE = "ray-node"  # whoami reply: the Ray node a simulation's ClientApp runs on (provenance)
NUM_EXAMPLES = "num-examples"  # METRICS: what a reply stands for (FedAvg's weight; 1 if absent)
DP_EPSILON = "dp-epsilon"  # METRICS: a client's DP-SGD epsilon so far, a record replaced (fedsim_tasks/dp_sgd.py)
DP_EPSILON_RDP = "dp-epsilon-rdp"  # METRICS: the same by an RDP bound
DP_EPSILON_PLD = "dp-epsilon-pld"  # METRICS: and by dp-accounting's PLD; dp-epsilon is the smaller
SERVER_ROUND = (
    "server-round"  # config: the round (Flower's strategies write it; seeds the client's work)
)
SEED = "seed"  # config (train): the run's seed
LOCAL_STEPS = "local-steps"  # config (train): optimizer steps
BATCH_SIZE = "batch-size"  # config (train): examples per step
LR = "lr"  # config (train): learning rate
TORCH_THREADS = "torch-threads"  # config: torch threads for this message's work
OBJECTIVE = "objective"  # config (train): what to train (each method names its objectives)
LOCAL_MODEL = (
    "local-model"  # config: the name under which a client keeps its own model across rounds
)
STATE_BYTES = "state-bytes"  # METRICS: bytes of the state a client keeps on its disk

# Flower's node config (a SuperNode's --node-config; the sharded grid's logical clients)
NODE_PARTITION_ID = PARTITION_ID  # the node's partition
NODE_NUM_PARTITIONS = "num-partitions"  # the federation's partitions
