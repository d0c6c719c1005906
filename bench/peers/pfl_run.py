"""The workload on pfl-research (``pfl`` 0.6.0, PyTorch): one runner of ``bench/simulation_peers.py``.

pfl's own simulation does the work: a ``FederatedDataset`` of the ``--clients`` clients, its
``SimulatedBackend`` and ``FederatedAveraging`` (diffs weighted by data points, a central SGD at
learning rate 1: plain averaging), its own local loop (``PyTorchModel.do_multiple_epochs_of``:
one epoch, the recipe's batch size and SGD learning rate). That loop batches a client's rows in
the order its dataset holds them, so each round's dataset holds them in the recipe's seeded
order (``BATCH_ORDER``): the batches, and so the steps, are those of ``Recipe.local_update``.

pfl draws users one at a time; ``MinimizeReuseUserSampler`` (the sampler its docs recommend)
walks a seeded permutation of the clients, so a round's ``--per-round`` clients are distinct
(the next ones of that permutation, not a fresh draw each round as fedsim and Flower do).

Install: pfl pins dp-accounting<0.6, Flower's ``dp`` extra (a fedsim dependency) >=0.6, so pip
refuses both together; pfl is installed without its dependencies (the ``bench`` extra adds
what it imports: prv-accountant): ``.venv/bin/pip install --no-deps pfl==0.6.0``.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import MinimizeReuseUserSampler
from pfl.hyperparam import NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn
from workload import parser, report, setting

from fedsim_tasks.topical_chat.turn_sentiment import BATCH_ORDER, client_rows, get_weights


class Classifier(nn.Module):
    """The recipe's MLP with the ``loss`` and ``metrics`` pfl's PyTorchModel calls."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(x)

    def loss(self, x, y):
        return nn.functional.cross_entropy(self.mlp(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # noqa: A002  (pfl's keyword)
        return {"loss": Weighted(float(self.loss(x, y)) * len(y), len(y))}


class TrainOnlyFedAvg(FederatedAveraging):
    """pfl evaluates every sampled user before and after its training whenever
    ``iteration % evaluation_frequency == 0``, true in iteration 0 for any frequency; the
    benchmark times training alone, as every runner does."""

    def get_next_central_contexts(self, *args, **kwargs):
        contexts, model, metrics = super().get_next_central_contexts(*args, **kwargs)
        if contexts is not None:
            contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
        return contexts, model, metrics


class RoundClock(TrainingProcessCallback):
    """The current round (1-based, for the batch order) and the seconds of each central iteration."""

    def __init__(self):
        self.round, self.seconds, self._start = 1, [], 0.0

    def on_train_begin(self, *, model):
        self._start = time.perf_counter()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now = time.perf_counter()
        self.seconds.append(now - self._start)
        self.round, self._start = central_iteration + 2, now
        return False, Metrics()


def main() -> None:
    s = setting(parser(__doc__.splitlines()[0]).parse_args())
    torch.set_num_threads(1)
    np.random.seed(
        s.seed
    )  # pfl's dataset and algorithm draw their own seeds from numpy's global state
    torch.manual_seed(s.seed)
    recipe, turns, clock = s.recipe, s.recipe.train_turns(), RoundClock()

    def client_dataset(client: int) -> Dataset:
        rows = client_rows(len(turns), s.clients, client)
        order = np.random.default_rng(BATCH_ORDER.seed(s.seed, round=clock.round, partition=client))
        rows = rows[order.permutation(len(rows))]
        # tensors: pfl turns numpy arrays into float32 tensors, labels included
        return Dataset(
            (torch.from_numpy(turns.x[rows]), torch.from_numpy(turns.y[rows])), user_id=client
        )

    users = np.random.default_rng(s.seed).permutation(s.clients).tolist()
    clients = FederatedDataset(client_dataset, MinimizeReuseUserSampler(users))
    network = Classifier(recipe.model(recipe.initial(s.seed)))
    model = PyTorchModel(
        network,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(network.parameters(), lr=1.0),
    )
    TrainOnlyFedAvg().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=s.rounds,
            evaluation_frequency=s.rounds + 1,
            train_cohort_size=s.per_round,
            val_cohort_size=None,
        ),
        backend=SimulatedBackend(
            training_data=clients, val_data=clients, postprocessors=[WeightByDatapoints()]
        ),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=1, local_learning_rate=recipe.lr, local_batch_size=recipe.batch_size
        ),
        callbacks=[clock],
    )
    report(
        clock.seconds,
        recipe.evaluate(get_weights(network.mlp)),
        package="pfl 0.6.0",
        sampling="distinct per round: consecutive slices of one seeded permutation",
    )


if __name__ == "__main__":
    main()
