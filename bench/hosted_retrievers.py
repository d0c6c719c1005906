"""Memory and time of a process hosting FedE4RAG clients (issue 60: one base model per worker).

A SuperNode or Ray actor that hosts several companies (``hardware.clients_per_supernode``) builds
one ``RetrieverClient`` per company it serves. This bench builds ``--clients`` of them (the first
companies of all 40 in FinanceBench's open sample, one client each) in one
process, as the ClientApp does, and sends each one train message of ``--steps`` steps: the
seconds to build each client, to train it, and the process's resident memory (psutil) before,
after the clients are built and after they trained. Run it at two commits to compare them
(it uses only ``RetrieverClient``'s constructor and ``train``).

    PYTHONPATH=. .venv/bin/python bench/hosted_retrievers.py --clients 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import psutil
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.records import to_record
from fedsim_clients import fede4rag_messages as keys
from fedsim_clients.retriever import RetrieverClient


def train_message(client: RetrieverClient, steps: int) -> Message:
    config = {
        keys.METHOD: "fedavg",
        keys.WEIGHTS: keys.FROM_ARRAYS,
        keys.LOCAL_STEPS: steps,
        keys.BATCH_SIZE: 8,
        keys.LR: 2e-5,
        keys.TEMPERATURE: 1.0,
        keys.KD_WEIGHT: 0.0,
        keys.SEED: 0,
        keys.SERVER_ROUND: 1,
        keys.TORCH_THREADS: 1,
    }
    content = RecordDict(
        {keys.CONFIG: ConfigRecord(config), keys.ARRAYS: to_record(client.initial)}
    )
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="companies hosted by the process")
    parser.add_argument("--steps", type=int, default=2, help="local steps of each train message")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    cfg = compose(["experiment=fede4rag_arms_t1", "task.companies=null"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    process = psutil.Process()
    rss = [process.memory_info().rss]
    population = RetrieverClient.population_size(task, cfg.data_root)  # a company each
    build, train, clients = [], [], []
    for partition in range(args.clients):
        start = time.perf_counter()
        clients.append(RetrieverClient(task, cfg.data_root, partition, population))
        build.append(time.perf_counter() - start)
    rss.append(process.memory_info().rss)
    for client in clients:
        start = time.perf_counter()
        client.train(train_message(client, args.steps))
        train.append(time.perf_counter() - start)
    rss.append(process.memory_info().rss)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = {
        "commit": commit.stdout.strip(),
        "clients": args.clients,
        "steps": args.steps,
        "build_s": build,
        "train_s": train,
        "median_build_s": statistics.median(build),
        "median_train_s": statistics.median(train),
        "rss_mb": {k: v / 2**20 for k, v in zip(("start", "built", "trained"), rss)},
        "mb_per_client": (rss[2] - rss[0]) / 2**20 / args.clients,
    }
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_s")}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
