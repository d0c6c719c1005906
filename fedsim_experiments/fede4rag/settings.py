"""FedE4RAG's settings: the protocol block of ``conf/experiment/fede4rag_paper.yaml`` typed and
checked before a run, and what an evaluation scores under them. The protocol that uses them is
``fedsim_experiments/fede4rag/protocol.py``; its tables and plots ``fedsim_experiments/fede4rag/report.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from fedsim.config.schema import Protocol
from fedsim_tasks.financebench_rag.inference import BACKENDS

LORA_AGGREGATIONS = (
    "factors",
    "product",
)  # a federated method's lora_aggregation: each factor apart, or B @ A


@dataclass(frozen=True, kw_only=True)
class FedE4RAGProtocol(Protocol):
    """FedE4RAG's protocol settings (``conf/experiment/fede4rag_paper.yaml``)."""

    local_steps: int  # optimizer steps per client and round
    batch_size: int  # pairs per step (in-batch negatives)
    lr: float  # AdamW learning rate, constant
    temperature: float  # InfoNCE temperature
    kd_weight: float  # weight of KD-GLE in FedE4RAG
    evaluator_partition: int  # the client that evaluates (under HE only clients hold the model)
    he_chunk_floats: int  # floats per encrypted chunk
    eval_pages_per_message: int  # corpus pages one evaluation message encodes
    eval_backend: str  # corpus encoder: torch | openvino | onnx (float32) | openvino_bf16
    eval_nodes: int  # clients that encode corpus pieces side by side (a shared store)
    eval_local: bool  # also evaluate each company's own retriever (methods with local_models)
    eval_per_filing: bool  # also score each question within its own filing's pages
    eval_per_client: (
        bool  # also score each client's questions within its own filings (own / others / global)
    )
    eval_every_round: (
        bool  # also evaluate a plaintext federated method's global model after every round
    )
    methods: dict[str, Any]
    """name -> {run: runner function, ...its settings}, in run order; null leaves a method out"""

    def he_methods(self) -> list[str]:
        return [name for name, spec in self.methods.items() if spec and spec.get("he")]

    def refuses_clock(self) -> str | None:
        return (
            "its methods are compared at one budget of optimizer steps over all companies "
            "(a straggler's dropped steps would spend it unevenly between arms), its HE rounds "
            "sum one encrypted update of every sampled company over several sub-phases, and "
            "its local and KD arms ask every company in each exchange: synchronous "
            "cross-silo rounds"
        )

    def __post_init__(self):
        if self.eval_backend not in BACKENDS:
            raise ValueError(
                f"protocol.eval_backend={self.eval_backend!r} is not one of {sorted(BACKENDS)}"
            )
        if self.eval_nodes < 1:
            raise ValueError(f"protocol.eval_nodes={self.eval_nodes} must be >= 1")
        for name, spec in self.methods.items():
            if spec and str(spec.get("run", "")).endswith(".local_only") and not self.eval_local:
                raise ValueError(
                    f"protocol.methods.{name} (local_only) has no global model: only its "
                    f"companies' own retrievers can be evaluated, so it needs protocol.eval_local=true"
                )
            if spec and spec.get("match_update_norm"):
                self._check_match(name, spec)
            if spec and spec.get("lora_aggregation", "factors") not in LORA_AGGREGATIONS:
                raise ValueError(
                    f"protocol.methods.{name}.lora_aggregation={spec.get('lora_aggregation')!r} "
                    f"is not one of {LORA_AGGREGATIONS}"
                )

    def _check_match(self, name: str, spec) -> None:
        """An anchoring control's ``match_update_norm: {method, reference}``: both plaintext
        federated methods that run before it (their rounds' update norms set its learning rate),
        and it plaintext too (under HE the server sees no update)."""
        match = spec["match_update_norm"]
        order = [n for n, s in self.methods.items() if s]
        before = order[: order.index(name)]
        named = isinstance(match, Mapping) and set(match) == {"method", "reference"}
        for key in ("method", "reference"):
            other = match[key] if named else None
            runs = self.methods[other] if other in before else None
            if (
                spec.get("he")
                or runs is None
                or not str(runs.get("run", "")).endswith(".federated")
                or runs.get("he")
            ):
                raise ValueError(
                    f"protocol.methods.{name}.match_update_norm.{key}={other!r} must name a "
                    f"plaintext federated method run before {name} (match_update_norm takes "
                    f"method and reference; {name} itself plaintext)"
                )

    def check_run(self, cfg: DictConfig, clients: int | None) -> None:
        """The evaluator and the encoding nodes must be clients of the federation; a product
        average of LoRA adapters needs adapters, and plaintext replies averaged by a mean."""
        if clients is not None and not (
            self.eval_nodes <= clients and 0 <= self.evaluator_partition < clients
        ):
            raise ValueError(
                f"protocol.eval_nodes={self.eval_nodes} and protocol.evaluator_partition="
                f"{self.evaluator_partition} need a federation of at least that many clients, "
                f"this one has {clients}"
            )
        for name, spec in self.methods.items():
            if not spec or spec.get("lora_aggregation", "factors") != "product":
                continue
            why = (
                "task.lora is null (full fine-tuning has no adapters)"
                if cfg.task.lora is None
                else "it runs under HE (the product is not linear in the ciphertexts)"
                if spec.get("he")
                else f"privacy.kind={cfg.privacy.kind} (the product would replace the wrapper's aggregate)"
                if cfg.privacy.kind != "none"
                else f"strategy {cfg.strategy._target_} aggregates by {cfg.strategy.traits.aggregation}, not a mean"
                if cfg.strategy.traits.aggregation != "mean"
                else None
            )
            if why:
                raise ValueError(
                    f"protocol.methods.{name}.lora_aggregation=product cannot run: {why}"
                )


def splits(cfg: DictConfig) -> list[str]:
    """The question splits the task holds (``task.n_test=0``: validation only)."""
    return [s for s in ("valid", "test") if int(cfg.task[f"n_{s}"])]


def scored(cfg: DictConfig) -> list[str]:
    """What an evaluation reports: each split on the shared corpus (``valid``), and with
    ``eval_per_filing`` within each question's own filing (``valid-filing``)."""
    corpora = ["", "-filing"] if cfg.protocol.eval_per_filing else [""]
    return [f"{s}{corpus}" for corpus in corpora for s in splits(cfg)]


@dataclass(frozen=True, kw_only=True)
class KDSweepProtocol(FedE4RAGProtocol):
    """The sweep's settings (``conf/experiment/fede4rag_kd_sweep.yaml``)."""

    budget_steps: int  # optimizer steps per client in every cell (local_steps x rounds)
    local_steps_grid: list[int]
    """local steps per round of the cells; each must divide budget_steps"""
    kd_weights: list[float]
    """KD-GLE weights of the cells (0 = FedAvg)"""
    he: bool  # aggregate the cells under CKKS (HEFedAvg): no client distance then

    def he_methods(self) -> list[str]:
        return (
            [cell_name(s, k) for s in self.local_steps_grid for k in self.kd_weights]
            if self.he
            else []
        )

    def __post_init__(self):
        super().__post_init__()  # eval_backend, eval_nodes
        if self.budget_steps < 1:
            raise ValueError(f"budget_steps must be >= 1, got {self.budget_steps}")
        if not self.local_steps_grid or not self.kd_weights:
            raise ValueError("local_steps_grid and kd_weights must name at least one value")
        bad = [s for s in self.local_steps_grid if s < 1 or self.budget_steps % s]
        if bad:
            raise ValueError(
                f"local_steps_grid {bad}: each must be >= 1 and divide "
                f"budget_steps={self.budget_steps}"
            )
        if any(k < 0 for k in self.kd_weights):
            raise ValueError(f"kd_weights must be >= 0, got {self.kd_weights}")
        if len(set(self.local_steps_grid)) < len(self.local_steps_grid) or len(
            set(self.kd_weights)
        ) < len(self.kd_weights):
            raise ValueError("local_steps_grid and kd_weights must not repeat a value")


def cell_name(steps: int, kd: float) -> str:
    return f"steps{steps}_kd{kd:g}"
