"""The workload on FLGo (``flgo`` 0.4.4): one runner of ``bench/simulation_peers.py``.

FLGo runs a task folder: ``flgo.gen_direct_task_from_file`` copies its "direct" benchmark (one
dataset per client, listed in a ``config.py``) into a temporary folder, and ``flgo.init`` loads
that config as a module. The config re-exports this runner's data and functions
(``from __main__ import ...``), so the task holds the workload's own clients (``client_rows``)
with nothing written but the folder. FLGo's FedAvg runs it in one process (its default
simulator, ``num_parallels`` 1): ``uniform`` sampling (``--per-round`` distinct clients a round,
numpy seeded from ``--seed``), ``other`` aggregation (average weighted by the sampled clients'
examples), its own local loop (``BasicClient.train``: SGD, one epoch of ``ceil(n / batch)``
steps, the recipe's batch size and learning rate). That loop batches a client's rows in the order
its dataset holds them, so a client reorders its rows each round in the recipe's seeded order
(``BATCH_ORDER``): the steps are those of ``Recipe.local_update``. No evaluation runs during
training (``eval_interval`` -1, no held-out rows: ``train_holdout`` 0).

Install: ``.venv/bin/pip install --no-deps flgo==0.4.4 prettytable ujson toolz``. FLGo requires
torchvision, but the index's torchvision 0.28.0 is a CUDA build that fails to load next to
torch 2.13.0+cpu (``operator torchvision::nms does not exist``), and FLGo imports it only for
image benchmarks and ``flgo.algorithm.standalone``, none of which run here.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import flgo
import numpy as np
import torch
from flgo.algorithm import fedbase
from torch import nn
from workload import parser, report, setting

from fedsim_tasks.topical_chat.turn_sentiment import BATCH_ORDER, client_rows, get_weights

CONFIG = (
    "from __main__ import train_data, data_to_device, compute_loss, get_model, evaluate as eval\n"
)
train_data: list = []  # the clients' datasets, filled by main() before FLGo imports the config
get_model = None  # the recipe's initial model, set by main()


class RoundOrderedRows(torch.utils.data.Dataset):
    """A client's rows in the recipe's seeded order for the round being trained."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, rows: np.ndarray, client: int, seed: int):
        self.x, self.y, self.rows, self.client, self.seed = x, y, rows, client, seed
        self.order = rows

    def reorder(self, server_round: int) -> None:
        rng = np.random.default_rng(
            BATCH_ORDER.seed(self.seed, round=server_round, partition=self.client)
        )
        self.order = self.rows[rng.permutation(len(self.rows))]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.x[self.order[i]], self.y[self.order[i]]


def data_to_device(batch, device):
    return [t.to(device) for t in batch]


def compute_loss(model, batch, device) -> dict:
    x, y = data_to_device(batch, device)
    return {"loss": nn.functional.cross_entropy(model(x), y)}


def evaluate(model, loader, device) -> dict:
    """Required by the benchmark's config; the final model is scored by ``Recipe.evaluate``."""
    raise NotImplementedError("the runner evaluates with Recipe.evaluate")


class Client(fedbase.BasicClient):
    def train(self, model):
        self.train_data.reorder(self.server.current_round)
        return super().train(model)


class Server(fedbase.BasicServer):
    """FedAvg whose ``iterate`` (sampling, local training, aggregation) is timed."""

    def initialize(self, *args, **kwargs):
        self.round_seconds = []

    def iterate(self):
        start = time.perf_counter()
        updated = super().iterate()
        self.round_seconds.append(time.perf_counter() - start)
        return updated


class TimedFedAvg:
    """The algorithm as FLGo takes one: a namespace with its Server and Client."""

    Server, Client = Server, Client


def main() -> None:
    global get_model
    s = setting(parser(__doc__.splitlines()[0]).parse_args())
    torch.set_num_threads(1)
    proportion = s.per_round / s.clients
    if int(s.clients * proportion) != s.per_round:  # FLGo samples int(num_clients * proportion)
        raise SystemExit(
            f"FLGo cannot sample {s.per_round} of {s.clients}: the proportion rounds off"
        )
    turns = s.recipe.train_turns()
    x, y = torch.from_numpy(turns.x), torch.from_numpy(turns.y)
    train_data.extend(
        RoundOrderedRows(x, y, client_rows(len(turns), s.clients, c), c, s.seed)
        for c in range(s.clients)
    )
    initial = s.recipe.initial(s.seed)
    get_model = lambda: s.recipe.model(initial)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="flgo-") as folder:
        os.chdir(folder)  # FLGo names the task's module by its path from the working directory
        sys.path.insert(0, folder)
        Path("config.py").write_text(CONFIG)
        task = flgo.gen_direct_task_from_file("turns", "config.py", target_path=folder)
        runner = flgo.init(
            task,
            TimedFedAvg,
            option={
                "seed": s.seed,
                "dataseed": s.seed,
                "num_rounds": s.rounds,
                "proportion": proportion,
                "sample": "uniform",
                "aggregate": "other",
                "num_epochs": 1,
                "batch_size": s.recipe.batch_size,
                "learning_rate": s.recipe.lr,
                "optimizer": "SGD",
                "train_holdout": 0.0,
                "eval_interval": -1,
                "num_parallels": 1,
                "torch_num_threads": 1,
                "gpu": [],
            },
        )
        # torch's first optimizer imports torch._dynamo (3.5 s here): pay it before round 1, as pfl_run
        # does building its central optimizer, so round 1 times FLGo rather than that import
        torch.optim.SGD(runner.model.parameters(), lr=s.recipe.lr)
        runner.run()
    report(
        runner.round_seconds,
        s.recipe.evaluate(get_weights(runner.model.model)),
        package="flgo 0.4.4",
        sampling="uniform without replacement, numpy seeded by FLGo from --seed",
    )


if __name__ == "__main__":
    main()
