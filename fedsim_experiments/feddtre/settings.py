"""FedDTRE's settings (``protocol`` of ``conf/experiment/feddtre_*.yaml``) and the checks that
refuse a wrong combination before the run; the protocol itself is ``fedsim_experiments/feddtre/protocol.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedsim.config.schema import Protocol
from fedsim_tasks.dialogue.dataset import DialogueTask, load_tasks, topical_chat_file
from fedsim_tasks.dp_sgd import DPSGD

SCORING = {
    "heldout",
    "trust",
}  # where a FedDTRE client's trust scores come from (protocol.generator.scoring)
FEDERATED_RUNNER = (
    "fedsim_experiments.feddtre.protocol.federated"  # the runner of every federated method
)
BASE_TRAIN_SPLITS, BASE_HELDOUT_SPLIT = (
    ("valid_freq", "valid_rare"),
    "test_freq",
)  # Topical-Chat, the base's corpus


@dataclass(frozen=True, kw_only=True)
class Generator:
    """The dialogue generator (``protocol.generator``)."""

    model: str  # causal LM; BERT names load as the warm-started decoder
    quantization: str | None  # null | 4bit (QLoRA, bitsandbytes NF4) | 8bit
    base_dir: str  # where the base SFT'd on Topical-Chat is saved once
    base_sft_steps: int  # full fine-tuning steps of the base on Topical-Chat valid
    base_sft_batch_size: int  # examples per base SFT step
    base_sft_lr: float  # AdamW learning rate of the base SFT
    base_seed: int | None  # base SFT seed (null: the run's); fixed: every run seed shares one base
    base_heldout: int  # Topical-Chat test_freq replies of the base's held-out loss
    lora: dict
    """the adapters every client trains (paper: r 8, alpha 16)"""
    max_length: int  # tokens of context + reply (the context is cut from the left)
    local_steps: int  # local optimizer steps per client and round (paper: 5)
    batch_size: int  # examples per step (paper: 16)
    lr: float  # AdamW learning rate in the first round
    lr_final: float  # ... in the last round (linear in between)
    eval_contexts: int  # contexts a FedDTRE client scores each model on (paper: 100); >= 2
    scoring: str  # heldout: the client's held-out dialogues | trust: its trust data (paper's eq. 9)
    loss_gap_examples: (
        int  # train and held-out replies of a mixing client's local-model nll gap (0: off)
    )
    max_new_tokens: int  # reply length cap
    temperature: float  # sampling temperature (seeded)
    top_p: float  # nucleus sampling
    dp_sgd: DPSGD
    """record-level DP of the clients' local steps (DP-SGD through Opacus; ``fedsim_tasks/dp_sgd.py``)"""

    def gap_examples(self) -> int:
        """Replies of each side of a mixing client's loss gap: none under DP-SGD, whose guarantee
        the nll of the training replies, released as it is, would not cover."""
        return 0 if self.dp_sgd.enabled else self.loss_gap_examples


@dataclass(frozen=True, kw_only=True)
class EvaluatorTraining:
    """Federated training of the trust evaluator (``protocol.evaluator``)."""

    strategy: dict
    """its Flower strategy (the same for every method: the evaluator is their shared instrument)"""
    rounds: int  # FedAvg rounds
    clients_per_round: int  # clients sampled per round
    local_steps: int  # optimizer steps per client and round
    batch_size: int  # trust examples per step
    lr: float  # AdamW learning rate of adapters and calibration
    heldout_contexts: int  # held-out contexts per dataset (3 trust pairs each) of the AUC


@dataclass(frozen=True, kw_only=True)
class FedDTREProtocol(Protocol):
    """FedDTRE's protocol settings (``conf/experiment/feddtre_paper.yaml``)."""

    clients_per_round: int  # clients sampled per generator round (paper: 2)
    test_contexts: int  # held-out contexts per dataset of the final evaluation
    personal_contexts: int  # own held-out contexts per client of the personalized evaluation
    generator: Generator
    evaluator: EvaluatorTraining
    alpha_gap_from_round: int  # first round of contamination alpha_late (leaking minus clean)
    methods: dict[str, Any]
    """name -> {run: runner function, strategy: Flower strategy (federated runners)}, in run order"""

    def method_names(self) -> list[str]:
        """Its methods, and the client groups of ``task.contamination`` (``contamination.methods.
        <method>.<dataset>.<group>``)."""
        return [*super().method_names(), "contaminated", "clean"]

    def refuses_clock(self) -> str | None:
        """None: the evaluator's and every federated method's rounds sample on the clock's
        quorum (``RunContext.clock_grid``); the per-client evaluation after them asks every
        client, as a measurement outside the clock's time."""
        return None

    def __post_init__(self):
        """Method names are components of dotted results paths and overrides, so they hold no
        dot; DP-SGD clips per-record gradients only: FedProx's proximal term would escape it."""
        dotted = [name for name in self.methods if "." in str(name)]
        if dotted:
            raise ValueError(
                f"protocol.methods: names {dotted} contain '.', which splits their results path "
                f"(methods.<name>.<dataset>) and their overrides; write e.g. 0p5 for 0.5"
            )
        g = self.generator
        if g.scoring not in SCORING:
            raise ValueError(f"protocol.generator.scoring={g.scoring!r}: one of {sorted(SCORING)}")
        for key, value, least in (
            ("generator.eval_contexts", g.eval_contexts, 2),  # a standard error needs 2
            ("generator.local_steps", g.local_steps, 1),
            ("generator.loss_gap_examples", g.loss_gap_examples, 0),
            ("personal_contexts", self.personal_contexts, 1),
            ("alpha_gap_from_round", self.alpha_gap_from_round, 1),
        ):
            if value < least:
                raise ValueError(f"protocol.{key}={value}: at least {least}")
        if g.dp_sgd.enabled and g.scoring == "trust":
            raise ValueError(
                "protocol.generator.scoring=trust scores replies to training contexts, which "
                "protocol.generator.dp_sgd does not cover: score on heldout"
            )
        proximal = [
            name
            for name, spec in self.methods.items()
            if ((spec or {}).get("strategy") or {}).get("proximal_mu")
        ]
        if self.generator.dp_sgd.enabled and proximal:
            raise ValueError(
                f"protocol.generator.dp_sgd with FedProx methods {proximal}: drop them "
                f"(~protocol.methods.{proximal[0]})"
            )

    def check_run(self, cfg: DictConfig, clients: int | None) -> None:
        """Flower would wait for nodes that never come: no round may sample more clients than
        the task has."""
        for key, per_round in (
            ("clients_per_round", self.clients_per_round),
            ("evaluator.clients_per_round", self.evaluator.clients_per_round),
        ):
            if per_round > int(cfg.task.num_clients):
                raise ValueError(
                    f"protocol.{key}={per_round} but the task has {cfg.task.num_clients} "
                    "clients (task.num_clients)"
                )
        if (
            clients is not None
        ):  # the population is known: the data was loaded, the contexts can be counted
            for split in (
                *BASE_TRAIN_SPLITS,
                BASE_HELDOUT_SPLIT,
            ):  # the base generator's corpus, read in the ServerApp
                topical_chat_file(str(cfg.data_root), split)
            task = OmegaConf.to_container(cfg.task, resolve=True)
            if why := self.context_shortfall(task, load_tasks(task, str(cfg.data_root))):
                raise ValueError(why)

    def scores_trust(self) -> bool:
        """Whether a method mixes by trust scores (a TrustAlpha strategy without a fixed alpha)."""
        return any(
            str(((spec or {}).get("strategy") or {}).get("_target_", "")).endswith(".TrustAlpha")
            and ((spec or {}).get("strategy") or {}).get("fixed_alpha") is None
            for spec in self.methods.values()
        )

    def context_shortfall(self, task: dict, tasks: dict[str, DialogueTask]) -> str | None:
        """A client holding fewer contexts than a setting asks for would score or evaluate on
        fewer (silently, a smaller and noisier sample): which client, dataset and setting."""
        g, wanted = self.generator, [("personal_contexts", self.personal_contexts, "heldout")]
        if self.scores_trust():
            wanted.append(("generator.eval_contexts", g.eval_contexts, g.scoring))
        for name, d in tasks.items():
            for partition in range(int(task["num_clients"])):
                data = d.client(partition)
                held = {
                    "heldout": len(d.examples(data.valid, " [SEP] ")),
                    "trust": min(
                        int(task["trust"]["contexts_per_client"]),
                        len(d.examples(data.train, " [SEP] ")),
                    ),
                }
                for key, n, source in wanted:
                    if held[source] < n:
                        return (
                            f"protocol.{key}={n} but client {partition} holds {held[source]} {source} contexts "
                            f"of {name} (raise task.valid_share / task.trust.contexts_per_client, or lower it)"
                        )
        return None

    def refuses_strategy(self, settings: dict) -> str | None:
        """The slot's methods (federated, naming no strategy) under DP-SGD: FedProx's term escapes it."""
        slot_methods = [
            name
            for name, spec in self.methods.items()
            if spec and spec.get("run") == FEDERATED_RUNNER and not spec.get("strategy")
        ]
        if self.generator.dp_sgd.enabled and settings.get("proximal_mu") and slot_methods:
            return (
                f"protocol.generator.dp_sgd clips per-record gradients only, and the proximal term of "
                f"methods {slot_methods} would escape it"
            )
        return None
