"""FedTP's settings: the protocol block of ``conf/experiment/fedtp.yaml`` typed and checked before a
run, and the routers every run scores. The protocol that uses them is ``protocol.py``; its tables
and plots ``report.py``."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from fedsim.config.schema import Protocol
from fedsim_tasks.topical_chat.dataset import load_topics


@dataclass(frozen=True, kw_only=True)
class FedTPProtocol(Protocol):
    """FedTP's protocol settings (``conf/experiment/fedtp.yaml``)."""

    alpha: float  # FedMix global weight
    lambdas: list[float]
    """lambda grid tuned on the task's tune_splits"""
    dp_sigmas: list[float]
    """sigma sweep of the FedMix router (re-releases of the received vectors)"""
    dp_seeds: int  # noise seeds per sigma
    bootstrap: int  # paired bootstrap resamples (of conversations) of the EHR gain CI

    def refuses_clock(self) -> str | None:
        return (
            "its DP prior is one release of every sampled client's row, its sensitivity and "
            "accounting fixed by who was sampled; a straggler left out would change both"
        )

    def refuses_audit(self, cfg: DictConfig) -> str | None:
        """The audit puts canary clients into DPMean's one release of every client's row (and so
        into each sigma's sweep release of them), each canary on a topic of its own."""
        if not str(cfg.strategy.get("_target_", "")).endswith("dp_mean.DPMean"):
            return "it audits DPMean's release (strategy=dp_mean)"
        if int(cfg.num_rounds) != 1 or float(cfg.strategy.fraction_train) < 1:
            return (
                "it audits one release of every client's row (num_rounds=1, strategy.fraction_train=1): "
                "sampled or repeated rounds would need the canaries sampled and composed as the clients are"
            )
        topics = len(load_topics(cfg.data_root))
        if cfg.privacy.audit.canaries > topics // 2:
            return (
                f"privacy.audit.canaries={cfg.privacy.audit.canaries} exceeds half the prior's {topics} "
                f"topics ({topics // 2}): each canary needs a topic of its own, and the release's scale "
                "is read off the others"
            )
        releases = 1 + len(self.dp_sigmas) * self.dp_seeds
        if releases >= topics // 2:
            return (
                f"its {releases} releases (the prior, protocol.dp_sigmas x protocol.dp_seeds) must be fewer "
                f"than half the prior's {topics} topics: their noise is checked against each other"
            )
        return None


ROUTERS = ("tfidf", "global", "local", "fedmix")
