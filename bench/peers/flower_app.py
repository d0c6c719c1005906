"""Plain Flower: the workload as a user would write it with Flower's Message API alone (the
quickstart's shape: a ClientApp whose train handler runs the local epoch, a ServerApp running
Flower's FedAvg), run by Flower's own simulation engine (``run_simulation``: Ray, one actor per
CPU, as fedsim's default ``hardware=cpu_2``). No validation, no journal, no client state: the
floor that fedsim's overhead is measured against. (The record names are Flower's FedAvg
defaults, spelled through ``fedsim.message_keys`` only because fedsim's lint keeps every key in one place.)

    python bench/peers/flower_app.py --clients 1000 --per-round 100 --rounds 3
"""

from __future__ import annotations

import logging
import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from workload import parser, report, setting

from fedsim.message_keys import (
    ARRAYS,
    CONFIG,
    METRICS,
    NODE_PARTITION_ID,
    NUM_EXAMPLES,
    SERVER_ROUND,
)

ARGS = setting(parser(__doc__).parse_args())
RECIPE = ARGS.recipe
client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    weights = msg.content[ARRAYS].to_numpy_ndarrays()
    new, examples, _ = RECIPE.local_update(
        weights,
        int(context.node_config[NODE_PARTITION_ID]),
        ARGS.clients,
        ARGS.seed,
        int(msg.content[CONFIG][SERVER_ROUND]),
    )
    return Message(
        RecordDict({ARRAYS: ArrayRecord(new), METRICS: MetricRecord({NUM_EXAMPLES: examples})}),
        reply_to=msg,
    )


@server.main()
def main(grid: Grid, context: Context) -> None:
    seconds, left = [], [None]

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        entered = time.monotonic()
        if left[0] is not None:
            seconds.append(entered - left[0])
        metrics = RECIPE.evaluate(arrays.to_numpy_ndarrays())
        left[0] = time.monotonic()
        return MetricRecord(metrics)

    strategy = FedAvg(
        fraction_train=ARGS.per_round / ARGS.clients,
        min_train_nodes=ARGS.per_round,
        fraction_evaluate=0.0,
        min_available_nodes=ARGS.clients,
    )
    result = strategy.start(
        grid, ArrayRecord(RECIPE.initial(ARGS.seed)), ARGS.rounds, evaluate_fn=evaluate
    )
    report(seconds, dict(result.evaluate_metrics_serverapp[ARGS.rounds]))


if __name__ == "__main__":
    logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(
        server,
        client,
        num_supernodes=ARGS.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
