"""ClientApp side of FedDTRE: a client holding conversations of every dialogue dataset.

query: who the client is (partition, training examples per dataset). train, by objective:
``evaluator``: the trust evaluator on the client's trust data (true replies against PII-planted
and off-context ones); ``generator``: the generator's adapters on one dataset's replies
(FedProx's proximal term when the config carries ``proximal-mu``). Without a mixing the client
starts from the global model (FedAvg, FedProx). With a mixing (``fedsim_strategies/trust_alpha.py``)
it keeps its own W_local across rounds (``fedsim/runtime/client_state.py``; the global model before its
first round), continues training it, and keeps and sends W = (1 - alpha) W_local +
alpha W_global, alpha fixed or from the trust scores of the local and the global model (greedy
replies to the same held-out contexts, so the difference is not sampling noise).
evaluate (after a method's rounds): its personalized model and the global one on its own
held-out contexts; metrics only go back. A client the task names in ``contamination`` trains
its generator on replies with planted PII (its trust data stays clean).
"""

from __future__ import annotations

import json
import time
from functools import lru_cache

from flwr.app import Message, MetricRecord, RecordDict

from fedsim.code_policy import instantiate_allowed
from fedsim.runtime import client_state
from fedsim.runtime.records import from_bytes
from fedsim.seeding import stream
from fedsim.trust_mixing import client_alpha, mix, relative_distance
from fedsim_clients import feddtre_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.causal_lm import mean_token_nll, sft_train, shared_policy, turn_separator
from fedsim_tasks.dialogue.dataset import answer_sample, contamination, load_tasks
from fedsim_tasks.dialogue.metrics import reply_scores
from fedsim_tasks.dialogue.trust_data import contaminate, trust_examples
from fedsim_tasks.dp_sgd import (
    DP_EPSILON,
    DP_EPSILON_PLD,
    DP_EPSILON_RDP,
    DPSGD,
    StepsLedger,
    spent_epsilons,
)
from fedsim_tasks.hf import load_trainable, trainable_arrays
from fedsim_tasks.proximal import proximal_mu

# the run's seed's streams (a round's training; FedDTRE's trust scoring; the personalized evaluation)
EVALUATOR_TRAINING = stream("trust-evaluator-training", "round", "partition")
GENERATOR_TRAINING = stream("generator-training", "round", "partition", "dataset")
TRUST_SCORE_CONTEXTS = stream("trust-score-contexts", "round", "partition", "dataset")
TRUST_SCORE_SAMPLING = stream("trust-score-sampling", "round", "partition", "dataset")
PERSONAL_SAMPLING = stream(
    "personal-sampling", "partition", "dataset"
)  # the same for every method and model
# the split seed's streams (the client's data, the same for every method)
TRUST_DATA = stream("client-trust-data", "partition", "dataset")
CONTAMINATION = stream("contamination", "partition", "dataset")
PERSONAL_CONTEXTS = stream("personal-contexts", "partition", "dataset")


@lru_cache(maxsize=1)
def _evaluator(spec: str, seed: int):
    """One trust evaluator per process (each message loads its weights)."""
    return instantiate_allowed(json.loads(spec), "task.evaluator", seed=seed)


def round_lr(settings: dict, server_round: int) -> float:
    """The learning rate of round t: linear from ``lr`` (round 1) to ``lr_final`` (the last)."""
    share = (server_round - 1) / max(settings["rounds"] - 1, 1)
    return settings["lr"] + (settings["lr_final"] - settings["lr"]) * min(max(share, 0.0), 1.0)


class DialogueClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        if num_partitions != task["num_clients"]:
            raise ValueError(
                f"{num_partitions} SuperNodes but the task has {task['num_clients']} clients "
                "(task.num_clients)"
            )
        super().__init__(task, data_root, partition_id, num_partitions)
        self.datasets = load_tasks(task, data_root)
        self.data = {name: d.client(partition_id) for name, d in self.datasets.items()}
        empty = [name for name, d in self.data.items() if not d.train or not d.valid]
        if empty:
            raise ValueError(
                f"client {partition_id} holds no training or held-out conversations of {empty}"
            )
        self._examples: dict = {}

    def examples(self, dataset: str, part: str, sep: str):
        key = (dataset, part, sep)
        if key not in self._examples:
            self._examples[key] = self.datasets[dataset].examples(
                getattr(self.data[dataset], part), sep
            )
        return self._examples[key]

    @property
    def evaluator(self):
        return _evaluator(json.dumps(self.task["evaluator"], sort_keys=True), self.task["seed"])

    def discover(self) -> dict:
        sep = " [SEP] "  # counts only: the separator does not change how many replies there are
        return {
            keys.EXAMPLES_PREFIX + name: len(self.examples(name, "train", sep))
            for name in self.data
        }

    def train(self, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        self.threads(config)
        start = time.perf_counter()
        objective = config.get(keys.OBJECTIVE)
        if objective == keys.EVALUATOR:
            weights, metrics = self._train_evaluator(msg)
        elif objective == keys.GENERATOR:
            weights, metrics = self._train_generator(msg)
        else:
            raise ValueError(f"client {self.partition_id}: unknown objective {objective!r}")
        metrics["train-seconds"] = time.perf_counter() - start
        return self.weights_reply(weights, metrics)

    def trust_data(self) -> list:
        """This client's trust examples: a sample of its training contexts of every dataset."""
        trust = self.task["trust"]
        out = []
        for name in sorted(self.data):
            examples = self.examples(name, "train", " [SEP] ")
            out += trust_examples(
                examples,
                trust["contexts_per_client"],
                TRUST_DATA.seed(self.task["split_seed"], partition=self.partition_id, dataset=name),
                trust["labels"],
            )
        return out

    def _train_evaluator(self, msg: Message):
        config = msg.content[keys.CONFIG]
        evaluator = self.evaluator
        evaluator.load(self.weights(msg))
        data = self.trust_data()
        stats = evaluator.train(
            data,
            int(config[keys.LOCAL_STEPS]),
            int(config[keys.BATCH_SIZE]),
            float(config[keys.LR]),
            self.seed(EVALUATOR_TRAINING, config),
            proximal_mu=proximal_mu(config),
        )
        return evaluator.weights(), {keys.NUM_EXAMPLES: len(data), "train-loss": stats["loss"]}

    def generator_examples(self, dataset: str, sep: str):
        """The client's generator training examples; a client the task names in
        ``contamination`` has planted PII in a seeded share of their replies."""
        key = (dataset, "generator", sep)
        if key not in self._examples:
            train = self.examples(dataset, "train", sep)
            clients, share = contamination(self.task)
            seed = CONTAMINATION.seed(
                self.task["split_seed"], partition=self.partition_id, dataset=dataset
            )
            self._examples[key] = (
                contaminate(train, share, seed) if self.partition_id in clients else train
            )
        return self._examples[key]

    def _generator(self, config) -> tuple:
        """The generator (one per process: each message loads its adapters), its tokenizer
        and the settings the message carries."""
        s = json.loads(config[keys.SETTINGS])
        return (
            *shared_policy(
                s["base"], json.dumps(s["lora"]), self.task["seed"], s.get("quantization")
            ),
            s,
        )

    def _train_generator(self, msg: Message):
        """Local SFT of the adapters on one dataset, from the global model or (under a mixing)
        the client's own; then the mix the strategy asks for (none: the weights as trained)."""
        config = msg.content[keys.CONFIG]
        model, tokenizer, s = self._generator(config)
        global_weights = self.weights(msg)
        rnd = self.server_round(config, 1)
        state = client_state.of(msg, self.partition_id) if keys.MIXING in config else None
        own = state.load(config[keys.LOCAL_MODEL], rnd) if state else None
        load_trainable(model, global_weights if own is None else own)
        sep, dataset = turn_separator(tokenizer), config[keys.DATASET]
        train = self.generator_examples(dataset, sep)
        metrics = self._sft(
            msg,
            model,
            tokenizer,
            [(e.prompt, e.reply) for e in train],
            s,
            self.seed(GENERATOR_TRAINING, config, dataset=dataset),
        )
        local = trainable_arrays(model)
        if state is None:
            return local, metrics
        weights = {"local": local, "global": global_weights}

        def score(which: str) -> list[float]:
            load_trainable(model, weights[which])
            return self._trust_scores(model, tokenizer, config, dataset, s)

        gap = self._loss_gap(
            model, tokenizer, train, dataset, sep, s
        )  # the local model's, before any mix
        alpha, scores = client_alpha(json.loads(config[keys.MIXING]), score)
        mixed = mix(local, global_weights, alpha)
        state.save(config[keys.LOCAL_MODEL], rnd, mixed)
        return mixed, {
            **metrics,
            **gap,
            keys.ALPHA: alpha,
            **scores,
            keys.STATE_BYTES: state.bytes(),
        }

    def _loss_gap(self, model, tokenizer, train: list, dataset: str, sep: str, s: dict) -> dict:
        """The loaded model's nll per token on ``loss_gap_examples`` of its training replies and
        as many held-out ones (evenly spaced: the same replies every round, no sampling noise
        between rounds): the gap is how far it overfits its own data, which FedDTRE's alpha
        should follow. Nothing with ``loss_gap_examples`` 0 or under DP-SGD (the training replies'
        nll, released as it is, is outside its guarantee: ``Generator.gap_examples``)."""
        n = 0 if s["dp_sgd"]["enabled"] else int(s["loss_gap_examples"])
        if not n:
            return {}
        held_out = self.examples(dataset, "valid", sep)
        pairs = {
            which: [(e.prompt, e.reply) for e in examples[:: max(len(examples) // n, 1)][:n]]
            for which, examples in (("train", train), ("held_out", held_out))
        }
        return {
            keys.TRAIN_NLL: mean_token_nll(model, tokenizer, pairs["train"], s["max_length"]),
            keys.HELDOUT_NLL: mean_token_nll(model, tokenizer, pairs["held_out"], s["max_length"]),
        }

    def _sft(self, msg: Message, model, tokenizer, train: list, s: dict, seed: int) -> dict:
        """Local SFT of the adapters; its metrics. Under ``dp_sgd`` the steps are DP-SGD's, every
        training's steps are appended to this client's ledger of the dataset's records on its disk
        (a round sent again counts again: its batches and noise are new), and the reply carries
        the epsilon the records have spent in every training that ended so far, every method's, for
        replacing one record (the reply publishes the record count): ``dp-epsilon``, the smaller of
        ``dp-epsilon-rdp`` and ``dp-epsilon-pld`` (what the server has seen of them; results.json,
        metrics.csv), and in this method's alone (``dp-epsilon-method``)."""
        config = msg.content[keys.CONFIG]
        steps, dp = (
            int(config[keys.LOCAL_STEPS]),
            DPSGD(**s["dp_sgd"]),
        )  # checked again: a client trusts no sender
        dp_state = {"horizon_steps": s["rounds"] * steps} if dp.enabled else {}
        stats = sft_train(
            model,
            tokenizer,
            train,
            steps=steps,
            batch_size=int(config[keys.BATCH_SIZE]),
            lr=round_lr(s, self.server_round(config, 1)),
            max_length=s["max_length"],
            seed=seed,
            proximal_mu=proximal_mu(config),
            dp=dp,
            **dp_state,
        )
        metrics = {keys.NUM_EXAMPLES: len(train), "train-loss": stats["loss"]}
        if dp.enabled:
            dataset = config[keys.DATASET]
            folder = client_state.of(msg, self.partition_id).folder
            ledger = StepsLedger(folder / f"dp-sgd-{dataset.replace('/', '-')}.jsonl")
            account = str(config.get(keys.DP_ACCOUNT, dataset))
            ledger.add(account, stats["dp-steps"])
            spent = spent_epsilons(ledger.history(), dp.delta)
            metrics |= {
                DP_EPSILON: spent.reported,
                DP_EPSILON_RDP: spent.rdp,
                DP_EPSILON_PLD: spent.pld,
                keys.DP_EPSILON_METHOD: spent_epsilons(ledger.history(account), dp.delta).reported,
                "dp-noise-multiplier": stats["dp-noise-multiplier"],
            }
        return metrics

    def _trained_evaluator(self, config):
        """The trust evaluator with the trained weights the message carries."""
        evaluator = self.evaluator
        evaluator.load(from_bytes(config[keys.EVALUATOR_WEIGHTS]))
        return evaluator

    def _trust_scores(self, model, tokenizer, config, dataset: str, s: dict) -> list[float]:
        """The trust score of the model's greedy reply to each of ``eval_contexts`` sampled
        scoring contexts of this client (the same sample for the local and the global model)."""
        sep = turn_separator(tokenizer)
        decoding = {"max_new_tokens": s["max_new_tokens"], "temperature": 0.0}
        chosen, replies = answer_sample(
            model,
            tokenizer,
            self.scoring_contexts(dataset, sep, s["scoring"]),
            s["eval_contexts"],
            self.seed(TRUST_SCORE_CONTEXTS, config, dataset=dataset),
            decoding,
            self.seed(TRUST_SCORE_SAMPLING, config, dataset=dataset),
        )
        return self._trained_evaluator(config).scores([e.context for e in chosen], replies).tolist()

    def scoring_contexts(self, dataset: str, sep: str, source: str) -> list:
        """Where FedDTRE's trust scores come from: ``heldout``, the client's held-out
        conversations; ``trust``, the contexts of its trust data (the paper's eq. 9 scores on the
        trust dataset; here a sample of its training contexts, ``task.trust.contexts_per_client``)."""
        if source == "heldout":
            return self.examples(dataset, "valid", sep)
        if source != "trust":
            raise ValueError(f"client {self.partition_id}: unknown scoring source {source!r}")
        key = (dataset, "trust", sep)
        if key not in self._examples:
            by_context = {e.context: e for e in self.examples(dataset, "train", sep)}
            self._examples[key] = [
                by_context[t.context]
                for t in self.trust_data()
                if t.kind == "true_reply" and t.context in by_context
            ]
        return self._examples[key]

    def evaluate(self, msg: Message) -> RecordDict:
        """After a method's rounds: the client's personalized model (its kept W_local; the
        global model where it keeps none: FedAvg, FedProx, or a client never sampled) and the
        global model answer one seeded sample of the client's own held-out contexts, with the
        final evaluation's seeded sampling and one sampling seed for both (common random
        numbers: the paired difference is the models', less the draw's). Only metrics go back;
        the weights stay here, the distance between them is one number."""
        config = msg.content[keys.CONFIG]
        self.threads(config)
        model, tokenizer, s = self._generator(config)
        global_weights = self.weights(msg)
        own = client_state.of(msg, self.partition_id).load(
            config[keys.LOCAL_MODEL], int(config[keys.SERVER_ROUND])
        )
        personal = global_weights if own is None else own
        dataset = config[keys.DATASET]
        held_out = self.examples(dataset, "valid", turn_separator(tokenizer))
        pick = PERSONAL_CONTEXTS.seed(
            self.task["split_seed"], partition=self.partition_id, dataset=dataset
        )
        seed = PERSONAL_SAMPLING.seed(
            config[keys.SEED], partition=self.partition_id, dataset=dataset
        )
        decoding = {k: s[k] for k in ("max_new_tokens", "temperature", "top_p")}
        evaluator = self._trained_evaluator(config)
        metrics = {
            keys.KEPT_LOCAL: float(own is not None),
            keys.DISTANCE: relative_distance(personal, global_weights),
        }
        for prefix, weights in ((keys.PERSONAL, personal), (keys.GLOBAL, global_weights)):
            load_trainable(model, weights)
            chosen, replies = answer_sample(
                model,
                tokenizer,
                held_out,
                int(config[keys.PERSONAL_CONTEXTS]),
                pick,
                decoding,
                seed,
            )
            metrics |= {prefix + k: v for k, v in reply_scores(replies, chosen, evaluator).items()}
        return RecordDict({keys.METRICS: MetricRecord({**metrics, keys.CONTEXTS: len(chosen)})})

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        """N clients, once every dataset's clients are built: a missing data file or a
        partitioner that does not give N clients is refused before any process starts."""
        load_tasks(task, str(data_root))
        return int(task["num_clients"])
