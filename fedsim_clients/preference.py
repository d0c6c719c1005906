"""ClientApp side of FedBis / FedBiscuit: a client holding its own preference pairs.

query: who the client is (partition, data sizes, population). train: the selector on its
pairs (FedBis, FedBiscuit), or the policy's adapters on its preferred responses (SFT, the FedAvg
baseline) or by DPO on its pairs (FedDPO), from the shared base the message names; each with
FedProx's proximal term where the config carries ``proximal-mu``. evaluate:
the regroup report, its mean validation loss on every selector the message carries.
"""

from __future__ import annotations

import json
import time
from functools import cached_property, lru_cache

import numpy as np
from flwr.app import Message, MetricRecord, RecordDict

from fedsim.code_policy import instantiate_allowed
from fedsim.runtime.records import from_record
from fedsim.seeding import stream
from fedsim_clients import preference_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.causal_lm import dpo_train, sft_train, shared_policy, turn_separator
from fedsim_tasks.hf import load_trainable, trainable_arrays
from fedsim_tasks.hh_preference.dataset import Federation
from fedsim_tasks.hh_preference.rlhf import policy_prompt
from fedsim_tasks.proximal import proximal_mu

TRAINING = stream(
    "preference-training", "round", "partition"
)  # a round's batches and dropout (selector or policy)


@lru_cache(maxsize=2)
def _selector(spec: str, seed: int):
    """One selector per process, shared by the clients a Ray actor serves (each message loads
    its weights): one encoder in memory, and one cache of frozen embeddings."""
    return instantiate_allowed(json.loads(spec), "task.selector", seed=seed)


class PreferenceClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        federation = Federation(task, data_root)
        if num_partitions != federation.num_clients:
            raise ValueError(
                f"{num_partitions} SuperNodes but the task partitions its pool over "
                f"{federation.num_clients} clients (task.partitioner.num_partitions)"
            )
        super().__init__(task, data_root, partition_id, num_partitions)
        self.data = federation.client(partition_id)
        if not self.data.train:
            raise ValueError(
                f"client {partition_id} holds no training pairs: lower "
                "task.partitioner.num_partitions or raise min_partition_size"
            )

    @property
    def selector(self):
        return _selector(json.dumps(self.task["selector"], sort_keys=True), self.task["seed"])

    @cached_property
    def initial_selector(self) -> dict[str, np.ndarray]:
        """The selector's seeded weights, as the server's initial model (a fresh selector: the shared
        one holds whichever weights its last message loaded)."""
        return instantiate_allowed(
            self.task["selector"], "task.selector", seed=self.task["seed"]
        ).weights()

    def initial_weights(self, msg: Message) -> dict[str, np.ndarray]:
        """The selector's initial weights (HE wraps selector training; the policies start from the
        base the message names, which the server sends)."""
        if msg.content[keys.CONFIG].get(keys.OBJECTIVE, keys.SELECTOR) != keys.SELECTOR:
            return super().initial_weights(msg)
        return self.initial_selector

    def discover(self) -> dict:
        return {
            keys.NUM_EXAMPLES: len(self.data.train),
            keys.NUM_VALID: len(self.data.valid),
            keys.POPULATION: self.data.population,
        }

    def train(self, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        self.threads(config)
        objective = config.get(keys.OBJECTIVE, keys.SELECTOR)
        if objective not in (keys.SELECTOR, keys.SFT, keys.DPO):
            raise ValueError(f"client {self.partition_id}: unknown objective {objective!r}")
        seed = self.seed(TRAINING, config)
        steps, batch, lr = (
            int(config[keys.LOCAL_STEPS]),
            int(config[keys.BATCH_SIZE]),
            float(config[keys.LR]),
        )
        start = time.perf_counter()
        if objective == keys.SELECTOR:
            model = self.selector
            model.load(self.weights(msg))
            stats = model.train(
                self.data.train,
                steps,
                batch,
                lr,
                seed,
                float(config.get(keys.WEIGHT_DECAY, 0.0)),
                proximal_mu=proximal_mu(config),
            )
            trained = model.weights()
        else:
            trained, stats = self._train_policy(msg, objective, steps, batch, lr, seed)
        metrics = {
            keys.NUM_EXAMPLES: len(self.data.train),
            keys.UNIT_WEIGHT: 1.0,
            "train-seconds": time.perf_counter() - start,
            "train-loss": stats["loss"],
        }
        return self.weights_reply(trained, metrics)

    def _train_policy(
        self, msg: Message, objective: str, steps: int, batch: int, lr: float, seed: int
    ):
        """The policy's adapters on this client's pairs: SFT on its preferred responses, or DPO."""
        config = msg.content[keys.CONFIG]
        settings = json.loads(config[keys.POLICY])
        model, tokenizer = shared_policy(
            config[keys.POLICY_BASE], json.dumps(settings["lora"]), self.task["seed"]
        )
        load_trainable(model, self.weights(msg))
        sep, length = turn_separator(tokenizer), settings["max_length"]
        pairs = [
            (
                policy_prompt(e.prompt, sep, settings["context_turns"]),
                *((e.a, e.b) if e.label == 0 else (e.b, e.a)),
            )
            for e in self.data.train[0::2]
        ]  # one order per pair: (prompt, preferred, other)
        mu = proximal_mu(config)
        if objective == keys.SFT:
            stats = sft_train(
                model,
                tokenizer,
                [(p, good) for p, good, _ in pairs],
                steps=steps,
                batch_size=batch,
                lr=lr,
                max_length=length,
                seed=seed,
                proximal_mu=mu,
            )
        else:
            stats = dpo_train(
                model,
                tokenizer,
                pairs,
                steps=steps,
                batch_size=batch,
                lr=lr,
                beta=float(settings["beta"]),
                max_length=length,
                seed=seed,
                proximal_mu=mu,
            )
        return trainable_arrays(model), stats

    def evaluate(self, msg: Message) -> RecordDict:
        """Mean validation loss on every selector ``model-<u>`` the message carries."""
        self.threads(msg.content[keys.CONFIG])
        losses = {}
        for name, record in msg.content.array_records.items():
            if name.startswith(keys.MODEL_PREFIX):
                self.selector.load(from_record(record))
                losses[keys.LOSS_PREFIX + name[len(keys.MODEL_PREFIX) :]] = self.selector.loss(
                    self.data.valid
                )
        if not losses:
            raise ValueError(
                f"client {self.partition_id}: regroup message carries no "
                f"{keys.MODEL_PREFIX}<u> selectors"
            )
        return RecordDict(
            {
                keys.METRICS: MetricRecord(
                    {**losses, keys.NUM_EXAMPLES: len(self.data.train), keys.UNIT_WEIGHT: 1.0}
                )
            }
        )

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        return int(task["partitioner"]["num_partitions"])
