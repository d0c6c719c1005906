"""FedProx's proximal term (Li et al. 2020), the one implementation every local training loop
adds to its loss: the retriever's (``financebench_rag/train.py``), the selectors'
(``hh_preference/selector.py``), the trust evaluator's and the causal LM's SFT and DPO
(``causal_lm.py``).

Flower's ``FedProx`` is FedAvg on the server plus ``proximal-mu`` in every train config
(:data:`CONFIG_KEY`): the term lives on the clients, and a client that does not add it trains
FedAvg's local objective. Flower ships no client-side term for torch (its examples write it
in each training loop), hence this one.
"""

from __future__ import annotations

import torch
from torch import nn

CONFIG_KEY = "proximal-mu"  # where Flower's FedProx puts mu in every train config


def proximal_mu(config) -> float:
    """The mu a train message's config carries (0 without FedProx)."""
    return float(config.get(CONFIG_KEY, 0.0))


class ProximalTerm:
    """``mu/2 ||w - w_global||^2`` over the trainable tensors of ``module``, ``w_global`` being
    what they hold when this is built (the weights the message brought; a client that then
    moves to its own weights keeps the global anchor). With mu 0 the loss is returned as it is:
    FedProx at mu 0 is FedAvg to the bit."""

    def __init__(self, module: nn.Module, mu: float):
        if mu < 0:
            raise ValueError(
                f"proximal-mu {mu} < 0: the term would push away from the global model"
            )
        self.mu = float(mu)
        trainable = (
            [p for _, p in sorted(module.named_parameters()) if p.requires_grad] if mu else []
        )
        self.anchored = [(p, p.detach().clone()) for p in trainable]

    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.anchored:
            return loss
        return loss + self.mu / 2 * sum(((p - a) ** 2).sum() for p, a in self.anchored)
