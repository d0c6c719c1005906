"""FedBis / FedBiscuit's settings: the protocol block of ``conf/experiment/fedbiscuit_paper.yaml``
(with its policy phase, ``protocol.rlhf``) typed and checked before a run. The protocol that uses
them is ``protocol.py`` (the policy phase ``rlhf.py``); its tables and plots ``report.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedsim.config.schema import Protocol
from fedsim_clients import preference_messages as keys

RUNNERS = (
    "fedsim_experiments.fedbiscuit.protocol"  # the module of the runners protocol.methods names
)


BASELINES = {"fedavg": keys.SFT, "feddpo": keys.DPO}
"""the policy phase's federated baselines and the clients' objective each runs"""


@dataclass(frozen=True, kw_only=True)
class RLHF:
    """Settings of the policy phase (``protocol.rlhf``)."""

    enabled: bool  # run the policy phase after the selectors
    server_threads: (
        int  # torch threads of the server's policy work (more oversubscribe a shared CPU)
    )
    policy_model: str  # causal LM; BERT names load as the warm-started decoder
    base_dir: str  # where the SFT'd base is saved once (clients read it)
    sft_steps: int  # full fine-tuning steps of the base on SPC valid
    sft_batch_size: int  # examples per SFT step
    sft_lr: float  # AdamW learning rate of the base SFT
    sft_heldout: int  # SPC test replies of the base's held-out loss
    context_turns: int  # dialogue turns the policy reads before its reply
    max_length: int  # tokens of prompt + reply (the prompt is cut from the left)
    lora: dict
    """LoRA adapters of every aligned policy (paper: r 8, alpha 16, dropout 0.05)"""
    completions: list[int]  # n sampled completions per prompt
    max_new_tokens: int  # reply length cap when sampling
    temperature: float  # sampling temperature
    top_p: float  # nucleus sampling
    dpo_steps: int  # DPO steps of each selector-labelled policy
    dpo_batch_size: int  # pairs per DPO step
    dpo_lr: float  # AdamW learning rate of the adapters
    beta: float  # DPO temperature
    judge_steps: int  # optimizer steps of the judge reward model
    eval_prompts: int  # held-out test prompts for win rates
    bootstrap: int  # paired bootstrap resamples of each win rate
    baseline_rounds: int  # rounds of the FedAvg (SFT) and FedDPO baselines
    baseline_steps: int  # local steps per client and round of the baselines
    selector_methods: list[str]
    """selector methods whose labels align a policy (those that ran)"""
    reference_method: str  # the other policies are compared with this one, prompt by prompt
    hacking_steps: list[int]
    """reward-hacking curves: cumulative DPO steps at which each selector-labelled policy is scored by its
    labellers (the proxy) and by the judge (empty: no curves)"""
    hacking_n: int  # the completions setting (one of ``completions``) whose labelled pairs train the curves
    hacking_methods: list[str] | None
    """the selector methods whose policies get curves (each a DPO run of max(hacking_steps)); null: every one"""
    baselines: list[str]
    """the federated policy baselines run after the selector-labelled policies: fedavg (SFT on
    the clients' preferred replies) and / or feddpo (the clients' DPO); []: none"""
    base_seed: int | None
    """seed of the raw model's SFT; null: the run's. A fixed one gives every seed of a sweep the same raw
    model, as the paper's seeds share one pretrained base"""

    def __post_init__(self):
        if self.hacking_steps and (
            self.hacking_n not in self.completions or min(self.hacking_steps) < 1
        ):
            raise ValueError(
                f"protocol.rlhf.hacking_n={self.hacking_n} must be one of completions "
                f"{self.completions} and hacking_steps {self.hacking_steps} positive"
            )
        if sorted(set(self.hacking_steps)) != self.hacking_steps:
            raise ValueError(
                f"protocol.rlhf.hacking_steps {self.hacking_steps} must ascend without repeats"
            )
        if not set(self.baselines) <= set(BASELINES) or len(set(self.baselines)) < len(
            self.baselines
        ):
            raise ValueError(
                f"protocol.rlhf.baselines {self.baselines} must be distinct of {list(BASELINES)}"
            )
        methods = self.hacking_methods
        if methods is not None and (
            not methods
            or len(set(methods)) < len(methods)
            or not set(methods) <= set(self.selector_methods)
        ):
            raise ValueError(
                f"protocol.rlhf.hacking_methods {methods} must be distinct selector_methods "
                f"{self.selector_methods} (null: every one)"
            )


@dataclass(frozen=True, kw_only=True)
class FedBiscuitProtocol(Protocol):
    """FedBis / FedBiscuit's protocol settings (``conf/experiment/fedbiscuit_paper.yaml``)."""

    local_steps: int  # selector optimizer steps per client and round (paper: 30)
    batch_size: int  # examples per step (paper: 32)
    lr: float  # AdamW learning rate of the selector (paper: 1e-5 for LoRA on Gemma-2B)
    weight_decay: float  # AdamW decoupled weight decay of the selector
    fraction_train: float  # share of clients sampled per round (paper: 10 of 200)
    warmup_rounds: int  # FedBiscuit: FedBis rounds per selector before grouping (paper: 50)
    regroup_every: int  # FedBiscuit: rounds between regroups (paper: 100)
    regroup_quorum: float  # share of clients whose loss reports a regroup needs
    central_steps: int  # optimizer steps of the central references
    client_weights: (
        str  # p_m of FedBis and eq. 6: data_share (the paper) | uniform (public code, 1/M)
    )
    methods: dict[str, Any]
    """name -> {run: runner function, ...its settings}, in run order"""
    rlhf: RLHF
    """the policy phase (``fedsim_experiments/fedbiscuit/rlhf.py``)"""

    def method_names(self) -> list[str]:
        """Its methods, and the policy phase's untuned policy and federated baselines
        (``policy.raw``, ``policy.fedavg``, ``policy.feddpo``)."""
        return [*super().method_names(), "raw", "fedavg", "feddpo"]

    def refuses_clock(self) -> str | None:
        """None: FedBis, SelectorGroups and the policy phase sample on the clock's quorum
        (``RunContext.clock_grid``); a regroup asks the clients online at its round's start,
        the others keep their group (as a regroup's clients that do not answer)."""
        return None

    def __post_init__(self):
        if self.client_weights not in WEIGHT_KEYS:
            raise ValueError(
                f"protocol.client_weights={self.client_weights!r} is not one of {sorted(WEIGHT_KEYS)}"
            )
        for name, spec in self.methods.items():
            if (
                spec
                and spec.get("run") == f"{RUNNERS}.oracle_groups"
                and int(spec.get("num_selectors", 0)) < 3
            ):
                raise ValueError(
                    f"protocol.methods.{name}.num_selectors must be >= 3 (one minority group, "
                    "majority groups)"
                )
            if (
                spec
                and spec.get("run") == f"{RUNNERS}.central"
                and spec.get("population") not in POPULATIONS
            ):
                raise ValueError(
                    f"protocol.methods.{name}.population={spec.get('population')!r} is not one of "
                    f"{POPULATIONS}"
                )


POPULATIONS = ("majority", "minority", "all")
"""whose training pairs a central reference pools"""


WEIGHT_KEYS = {"data_share": keys.NUM_EXAMPLES, "uniform": keys.UNIT_WEIGHT}
"""p_m's numerator per client: its training examples, or 1 (the reply metric each names)"""
