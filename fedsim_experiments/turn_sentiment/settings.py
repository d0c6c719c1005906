"""Turn sentiment's settings: the protocol block of ``conf/experiment/turn_sentiment_fedavg.yaml``
typed and checked before a run (the protocol: ``protocol.py``; its table: ``report.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import Protocol, require


@dataclass(frozen=True, kw_only=True)
class TurnSentimentProtocol(Protocol):
    """Settings of ``conf/experiment/turn_sentiment_fedavg.yaml``."""

    clients_per_round: int | None  # clients sampled per round (null: every client)
    target_loss: float | None
    """under a virtual clock: the test loss whose first virtual time is reported"""

    def refuses_clock(self) -> str | None:
        return None  # every round is RunContext.fedavg's, sampled on the clock's quorum

    def __post_init__(self):
        require(
            self.clients_per_round is None or self.clients_per_round >= 1,
            "protocol.clients_per_round",
            ">= 1 (null: every client)",
            self.clients_per_round,
        )
