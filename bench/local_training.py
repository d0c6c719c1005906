"""FedE4RAG local training under Flower against the same steps in a plain loop, one run.

(b) Flower: ``fedsim run experiment=fede4rag_paper`` with one federated method (default KD-GLE,
plaintext FedAvg), ``hardware.num_cpus=1`` (one Ray actor, ``client_cpus=1``: one torch thread,
the 4 clients in turn) and evaluation cut to a small corpus. Every train reply times its parts
(``fedsim_clients/retriever.py``); ``metrics.csv`` holds their mean per round, ``results.json`` the
round's seconds as the server saw them.
(a) Plain: in this process, after the run, the same clients (their pages, pairs and model, built
by the same class), rounds, seeds, steps, batch and torch threads (those the actor reported),
calling ``train_encoder`` directly, the weights averaged in numpy between rounds as FedAvg does.

Prints optimizer steps/s for both and their ratio; each side's time against its own steps (robust
to load that changes between the halves on a shared machine); the seconds of each part per train
message; and the mean training loss per round on both sides (the same work: equal).

    .venv/bin/python bench/local_training.py [--rounds 3] [--kd-weight 1.0] [overrides ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from fedsim.message_keys import TORCH_THREADS
from fedsim_clients.retriever import TRAINING, RetrieverClient
from fedsim_tasks.financebench_rag.train import train_encoder
from fedsim_tasks.hf import load_trainable, trainable_arrays

FEDSIM = str(Path(sys.executable).parent / "fedsim")
METHOD = "local"
PARTS = ("weights", "pairs", "setup", "step", "teardown", "reply")


def flower(out: Path, rounds: int, kd_weight: float, overrides: list[str]) -> Path:
    method = f"{{{METHOD}: {{run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: {kd_weight}, he: false}}}}"
    subprocess.run(
        [
            FEDSIM,
            "run",
            "experiment=fede4rag_paper",
            f"num_rounds={rounds}",
            "hardware.num_cpus=1",
            "task.n_valid=4",
            "task.n_test=6",
            "task.corpus_pages_per_doc=8",
            "task.embedding_cache=null",
            f"task.he.key_dir={out / 'keys'}",
            f"client_state.dir={out / 'state'}",
            "~protocol.methods",
            f"+protocol.methods={method}",
            f"results_dir={out / 'results'}",
            *overrides,
        ],
        check=True,
    )
    return out / "results"


def flower_rows(results: Path) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """Per round of ``METHOD/train``: the exchange's values and the replies' mean metrics; and the
    seconds of every other exchange (``discover`` builds the clients)."""
    rounds, other = defaultdict(dict), {}
    with open(results / "metrics.csv") as fh:
        for row in csv.DictReader(fh):
            if row["phase"] == f"{METHOD}/train":
                rounds[int(row["round"])][row["name"].removeprefix("metric/")] = float(row["value"])
            elif row["name"] == "seconds":
                other[row["phase"]] = other.get(row["phase"], 0.0) + float(row["value"])
    return dict(sorted(rounds.items())), other


def plain(cfg, rounds: int, kd_weight: float, threads: int, clients: int) -> dict:
    """The same local training as the run's, in this process: per round and client, the seconds of
    each part and the loss; the clients' construction (model, pairs) once."""
    torch.set_num_threads(threads)
    task, p = OmegaConf.to_container(cfg.task, resolve=True), cfg.protocol
    start = time.perf_counter()
    nodes = {
        partition_id: RetrieverClient(task, cfg.data_root, partition_id, clients)
        for partition_id in range(clients)
    }
    built = time.perf_counter()
    sizes = {partition_id: len(c.pairs) for partition_id, c in nodes.items()}
    paired = time.perf_counter()
    weights, log = nodes[0].initial, defaultdict(dict)
    for rnd in range(1, rounds + 1):
        updates = {}
        for partition_id, c in nodes.items():
            t0 = time.perf_counter()
            load_trainable(c.model, weights)
            t1 = time.perf_counter()
            stats = train_encoder(
                c.model,
                c.pairs,
                p.local_steps,
                p.batch_size,
                p.lr,
                p.temperature,
                kd_weight,
                seed=TRAINING.seed(cfg.seed, round=rnd, partition=partition_id),
            )
            t2 = time.perf_counter()
            updates[partition_id] = trainable_arrays(c.model)
            t3 = time.perf_counter()
            log[rnd][partition_id] = {
                "weights": t1 - t0,
                "pairs": 0.0,
                "train": t2 - t1,
                "reply": t3 - t2,
                "handler": t3 - t0,
                **stats,
            }
        total = sum(sizes.values())  # FedAvg: weighted by pairs, float32 as Flower's aggregate
        weights = {
            k: sum(
                np.float32(sizes[partition_id] / total) * u[k]
                for partition_id, u in updates.items()
            )
            for k in weights
        }
    return {"rounds": log, "build": built - start, "pairs": paired - built}


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kd-weight", type=float, default=1.0, help="0 = plain FedAvg's objective")
    parser.add_argument(
        "overrides", nargs="*", help="more fedsim overrides, e.g. protocol.local_steps=12"
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="local-training-"))
    load = [
        os.getloadavg()[0]
    ]  # others' work on the machine: the two halves may see different load
    results = flower(out, args.rounds, args.kd_weight, args.overrides)
    load.append(os.getloadavg()[0])
    fl, exchanges = flower_rows(results)
    cfg = OmegaConf.load(results / "config.yaml")
    clients = len(json.loads((results / "results.json").read_text())["clients"])
    threads = {int(r[TORCH_THREADS]) for r in fl.values()}
    if len(threads) != 1:
        raise SystemExit(f"the actor's torch threads changed between rounds: {threads}")
    pl = plain(cfg, args.rounds, args.kd_weight, threads.pop(), clients)
    load.append(os.getloadavg()[0])

    steps = int(cfg.protocol.local_steps)
    pl_msgs = [m for r in pl["rounds"].values() for m in r.values()]
    for m in pl_msgs:
        m["teardown"] = m["train"] - m["setup-seconds"] - m["step-seconds"]
        m["setup"], m["step"] = m["setup-seconds"], m["step-seconds"]
    fl_rounds = list(fl.values())
    for r in fl_rounds:
        r |= {
            "weights": r["weights-seconds"],
            "pairs": r["pairs-seconds"],
            "setup": r["setup-seconds"],
            "step": r["step-seconds"],
            "reply": r["reply-seconds"],
            "handler": r["handler-seconds"],
            "teardown": r["train-seconds"] - r["setup-seconds"] - r["step-seconds"],
        }
    pl_round = [sum(m["handler"] for m in r.values()) for r in pl["rounds"].values()]
    fl_round = [r["seconds"] for r in fl_rounds]
    rate = {  # optimizer steps per second: the steps alone, the whole train message, the round
        "steps only": (steps / mean(pl_msgs, "step"), steps / mean(fl_rounds, "step")),
        "train message (ClientApp handler)": (
            steps / mean(pl_msgs, "handler"),
            steps / mean(fl_rounds, "handler"),
        ),
        "round (server's wall clock)": (
            steps * clients * len(pl_round) / sum(pl_round),
            steps * clients * len(fl_round) / sum(fl_round),
        ),
    }
    print(
        f"\n{clients} clients x {args.rounds} rounds x {steps} steps, batch {cfg.protocol.batch_size}, "
        f"kd_weight {args.kd_weight}, torch threads {torch.get_num_threads()} (plain) = actor's\n"
    )
    print(
        "| measured over | plain steps/s | Flower steps/s | plain / Flower | plain: steps only / this | "
        "Flower: steps only / this |"
    )
    print("|---|---|---|---|---|---|")
    only = rate["steps only"]
    for what, (a, b) in rate.items():
        print(
            f"| {what} | {a:.3f} | {b:.3f} | {a / b:.3f} | {only[0] / a:.3f} | {only[1] / b:.3f} |"
        )
    print(
        f"\nload average (1 min): {load[0]:.1f} at start, {load[1]:.1f} after Flower, {load[2]:.1f} after plain"
    )
    print("\nSeconds per train message (mean over clients and rounds)\n")
    print("| part | plain | Flower |")
    print("|---|---|---|")
    for part in PARTS + ("handler",):
        print(f"| {part} | {mean(pl_msgs, part):.3f} | {mean(fl_rounds, part):.3f} |")
    transport = [f - clients * r["handler"] for f, r in zip(fl_round, fl_rounds)]
    print(
        f"| Flower outside the handler (round s - clients x handler) | | {sum(transport) / len(transport):.3f} |"
    )
    print("\nOnce per client: construction (model) and pairs\n")
    print(
        f"plain: model {pl['build'] / clients:.2f} s, pairs {pl['pairs'] / clients:.2f} s per client; "
        f"Flower: discover exchange {exchanges.get('discover', float('nan')):.2f} s for {clients} clients "
        f"(actor start, imports, model and pairs), initial-weights {exchanges.get('initial-weights', 0):.2f} s"
    )
    print(
        "\nPer round: seconds (plain sum of messages | Flower round), mean loss (plain | Flower)\n"
    )
    for rnd, (a, b) in enumerate(zip(pl_round, fl_round), start=1):
        ploss = mean(list(pl["rounds"][rnd].values()), "loss")
        print(
            f"round {rnd}: {a:.2f} | {b:.2f} s; loss {ploss:.6f} | {fl[rnd]['loss']:.6f} "
            f"(diff {abs(ploss - fl[rnd]['loss']):.2e})"
        )


if __name__ == "__main__":
    main()
