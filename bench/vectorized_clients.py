"""What one SuperNode's hosted clients' local epochs cost on the turn-sentiment workload as a
loop of :meth:`Recipe.local_update` (what every backend runs today: one client after the other)
against one batched computation over all of them (:meth:`Recipe.local_updates`,
``torch.func.vmap``), in this process, one torch thread, the two alternated ``--repeats`` times.

Prints the median seconds of each, their ratio, and the largest difference between the two
results (the same epochs: equal to float order). Issue 60: the clients' epochs are the largest
part of a round of 100 clients (docs/benchmarks/simulation-peers.md); this measures what a
columnar client backend would gain on them before it is built.

    .venv/bin/python bench/vectorized_clients.py [--clients 10000] [--hosted 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from fedsim.config.data import resolve_data_root
from fedsim_tasks.topical_chat.turn_sentiment import Recipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10_000, help="the population (turns each)")
    p.add_argument("--hosted", type=int, default=50, help="clients of one SuperNode's round")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    task = OmegaConf.to_container(OmegaConf.load("conf/task/turn_sentiment.yaml"), resolve=False)
    recipe = Recipe.of(task, str(resolve_data_root()))
    rng = np.random.default_rng(args.seed)
    clients = sorted(rng.choice(args.clients, args.hosted, replace=False).tolist())
    weights = recipe.initial(args.seed)

    def loop():
        return [recipe.local_update(weights, c, args.clients, args.seed, 1) for c in clients]

    def batched():
        return recipe.local_updates(weights, clients, args.clients, args.seed, 1)

    looped, stacked = loop(), batched()  # warm: data, model, torch's first calls
    seconds = {"loop": [], "batched": []}
    for _ in range(args.repeats):
        for name, run in (("loop", loop), ("batched", batched)):
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    gap = max(
        float(np.abs(stacked[0][k][i] - looped[i][0][k]).max())
        for i in range(len(clients))
        for k in range(len(weights))
    )
    median = {k: statistics.median(v) for k, v in seconds.items()}
    print(
        json.dumps(
            {
                "clients": args.clients,
                "hosted": args.hosted,
                "loop_s": median["loop"],
                "batched_s": median["batched"],
                "loop_over_batched": median["loop"] / median["batched"],
                "ms_per_client_loop": 1000 * median["loop"] / args.hosted,
                "ms_per_client_batched": 1000 * median["batched"] / args.hosted,
                "max_abs_difference": gap,
            }
        )
    )


if __name__ == "__main__":
    main()
