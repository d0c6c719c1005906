"""FedProx's proximal term, the one every local loop adds (``fedsim_tasks/proximal.py``)."""

import pytest
import torch
from torch import nn

from fedsim_tasks.proximal import ProximalTerm, proximal_mu


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    model[0].bias.requires_grad_(False)  # frozen: not in the term
    return model


def test_the_term_is_mu_half_the_squared_distance_to_the_weights_it_was_built_on():
    model = _model()
    term = ProximalTerm(model, 4.0)
    with (
        torch.no_grad()
    ):  # the client moves to weights of its own (FedE4RAG's companies): the anchor stays
        model[0].weight += 1.0
        model[1].bias -= 0.5
        model[0].bias += 100.0
    loss = torch.tensor(1.5)
    assert float(term(loss)) == pytest.approx(1.5 + 4.0 / 2 * (6 * 1.0 + 0.25))


def test_mu_0_is_fedavg_to_the_bit_and_a_negative_mu_is_refused():
    model, loss = _model(), torch.tensor(2.0)
    assert ProximalTerm(model, 0.0)(loss) is loss
    with pytest.raises(ValueError, match="< 0"):
        ProximalTerm(model, -1.0)
    assert proximal_mu({"proximal-mu": 0.5}) == 0.5 and proximal_mu({}) == 0.0
