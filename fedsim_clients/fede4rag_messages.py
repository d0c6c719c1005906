"""FedE4RAG's message format: the record and config keys that the protocol
(``fedsim_experiments/fede4rag.py``) and the client (``fedsim_clients/retriever.py``) exchange. HE chunk
operations use ``fedsim.he.messages``."""

CONFIG = "config"                # ConfigRecord of every message
ARRAYS = "arrays"                # ArrayRecord: trainable weights (plaintext)
METRICS = "metrics"              # MetricRecord of replies
INFO = "info"                    # ConfigRecord of the discovery reply ...
PARTITION_ID = "partition-id"    # ... the node's partition
DOCUMENTS = "documents"          # ... its documents
COMPANIES = "companies"          # ... their companies
NUM_PAIRS = "num-pairs"          # ... its training pairs
QUERY_OP = "query-op"            # config (query): INITIAL_WEIGHTS, else discovery
INITIAL_WEIGHTS = "initial-weights"  # QUERY_OP value: reply with the common initial weights

METHOD = "method"                # config: the method the message serves (named in errors)
WEIGHTS = "weights"              # config: the weights to train / evaluate, one of:
FROM_ARRAYS = "arrays"           #   the message's ARRAYS (must be present and non-empty)
FROM_HE = "he-global"            #   the node's complete HE aggregate of he-global-round
FROM_INITIAL = "initial"         #   the common initial model (seeded adapters)
FROM_LOCAL = "local"             #   the node's own local retriever kept under LOCAL_MODEL (evaluate)
WEIGHT_SOURCES = (FROM_ARRAYS, FROM_HE, FROM_INITIAL, FROM_LOCAL)
LOCAL_MODEL = "local-model"      # config: the name under which the node keeps its own retriever across
                                 # rounds (train: the student continues from it, the received weights are
                                 # KD's frozen teacher); absent: train from the received weights

LOCAL_STEPS = "local-steps"      # config (train): optimizer steps
BATCH_SIZE = "batch-size"        # config (train): pairs per step
LR = "lr"                        # config (train): AdamW learning rate
TEMPERATURE = "temperature"      # config (train): InfoNCE temperature
KD_WEIGHT = "kd-weight"          # config (train): weight of KD-GLE
SEED = "seed"                    # config (train): the run's seed
SERVER_ROUND = "server-round"    # config (train): the round (seeds the local shuffle)
POOL_PARTITIONS = "pool-partitions"  # config (train): pool these partitions' pairs (centralized)
TORCH_THREADS = "torch-threads"  # config: torch threads for this message's work
NUM_EXAMPLES = "num-examples"    # METRICS (train): pairs, FedAvg's weight

EVAL_OP = "eval-op"              # config (evaluate): ENCODE or SCORE
ENCODE = "encode"                # encode one piece of the corpus (PIECE) under the weights
SCORE = "score"                  # retrieve and score with the fully encoded corpus
PAGES_PER_MESSAGE = "pages-per-message"  # config (evaluate): pages of one ENCODE piece
PIECE = "piece"                  # config (encode): index of the piece to encode (skipped if present)
EVAL_BACKEND = "eval-backend"    # config (evaluate): corpus encoder, a key of inference.BACKENDS
SPLITS = "splits"                # config (evaluate): question splits to score
PER_FILING = "per-filing"        # config (evaluate): also score within each question's filing
MISSING = "missing-pieces"       # METRICS (encode): indices of the pieces still missing after this one
PIECES = "pieces"                # METRICS (encode): pieces of the corpus in all
CORPUS_PAGES = "corpus-pages"    # METRICS (encode): pages of the corpus
WEIGHTS_INFO = "weights-info"    # ConfigRecord of evaluate replies ...
WEIGHTS_KEY = "key"              # ... fingerprint of the weights evaluated
