"""HE overhead of one FedAvg round: CKKS (HEFedAvg) vs plaintext (Flower FedAvg), measured in
the same run for LoRA-only and full-model MiniLM updates.

Both rounds take the clients' real path: every message goes through the platform's ClientApp
(its mods, its per-message seeding, the node's own folders) to a ``ClientHandler``; under HE the
ClientApp wraps that handler in the HE layer (``fedsim/runtime/he_layer.py``) because the task
carries the retriever's CKKS block (``conf/task/financebench_rag.yaml``), as in a run. The
handler trains nothing (training costs the same with or without HE): its "trained" weights are
the real model's trainable weights plus fixed noise. Messages go through Flower's protobuf wire
format (``InProcessGrid``), so bytes are message sizes.

    .venv/bin/python bench/he_overhead.py [--clients 2] [--updates lora full]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import cache, partial
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.message_keys import NODE_NUM_PARTITIONS, NODE_PARTITION_ID, NUM_EXAMPLES
from fedsim.runtime import client_app
from fedsim.runtime.client_state import RUN_KEY
from fedsim.runtime.he_layer import flatten
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.records import to_record
from fedsim_clients.handler import ClientHandler
from fedsim_strategies.he_fedavg import HEFedAvg
from fedsim_tasks.hf import build_encoder, trainable_arrays

LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["query", "value"]}


@cache
def updates(kind: str, clients: int) -> tuple[dict, list[dict]]:
    """The real model's trainable weights (``lora`` or ``full``) and each client's perturbed copy;
    cached so that the timed rounds never build the model."""
    base = trainable_arrays(
        build_encoder("all-MiniLM-L6-v2", 128, LORA if kind == "lora" else None, seed=0)
    )
    rng = np.random.default_rng(0)
    return base, [
        {k: (v + 1e-3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in base.items()}
        for _ in range(clients)
    ]


class FixedUpdate(ClientHandler):
    """A client whose training returns its perturbed copy of the model (``updates``)."""

    def initial_weights(self, msg: Message) -> dict[str, np.ndarray]:
        return updates(self.task["update"], self.num_partitions)[0]

    def train(self, msg: Message) -> RecordDict:
        return self.weights_reply(
            updates(self.task["update"], self.num_partitions)[1][self.partition_id],
            {NUM_EXAMPLES: 100},
        )


def serve(msg: Message, partition: int, clients: int, node: dict) -> RecordDict:
    """``msg`` through the platform's ClientApp, as partition ``partition`` on a node configured by ``node``."""
    context = Context(
        run_id=1,
        node_id=partition + 1,
        state=RecordDict(),
        run_config={},
        node_config={**node, NODE_PARTITION_ID: partition, NODE_NUM_PARTITIONS: clients},
    )
    return client_app.app(msg, context).content


def _grid(clients: int, node: dict) -> InProcessGrid:
    return InProcessGrid(
        {p + 1: partial(serve, partition=p, clients=clients, node=node) for p in range(clients)},
        keep_replies=False,
    )


def _train_config(kind: str, run: str, he: dict | None = None) -> ConfigRecord:
    """What the server sends every message: the task (the client, its update, CKKS where ``he``)
    and the run's key (each round below its own client state)."""
    task = {
        "client": f"{FixedUpdate.__module__}.{FixedUpdate.__name__}",
        "data_root": None,
        "update": kind,
        **({"he": he} if he else {}),
    }
    return ConfigRecord({client_app.TASK_KEY: json.dumps(task), RUN_KEY: run})


def plain_round(kind: str, clients: int, node: dict) -> dict:
    grid = _grid(clients, node)
    start = time.perf_counter()
    FedAvg(fraction_evaluate=0.0, min_available_nodes=clients, min_train_nodes=clients).start(
        grid,
        to_record(updates(kind, clients)[0]),
        num_rounds=1,
        train_config=_train_config(kind, f"plain-{kind}"),
    )
    return {
        "seconds_per_round": time.perf_counter() - start,
        "bytes_per_client_round": grid.bytes_up / clients,
    }


def he_round(kind: str, clients: int, node: dict, chunk_floats: int, one_trip: bool) -> dict:
    he = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "financebench_rag.yaml").he)
    run = f"he-{kind}-{'one-trip' if one_trip else 'chunked'}"
    grid = _grid(clients, node)
    strategy = HEFedAvg(
        FedAvg(min_available_nodes=clients, min_train_nodes=clients),
        chunk_floats=chunk_floats,
        one_trip=one_trip,
    )
    start = time.perf_counter()
    strategy.start(grid, num_rounds=1, train_config=_train_config(kind, run, he))
    seconds = time.perf_counter() - start
    r = strategy.rounds[1]
    # in-process clients run one after another: their seconds add up
    crypto = (
        clients * (r["encrypt-seconds-per-client"] + r["decrypt-seconds-per-client"])
        + r["aggregate-seconds"]
    )
    expected = np.mean([flatten(u) for u in updates(kind, clients)[1]], axis=0)
    got = np.load(
        Path(node["state-dir"]) / f"run-{run}" / "client-0" / "global-1.npy"
    )  # node 0's aggregate
    return {
        "seconds_per_round": seconds,
        "bytes_per_client_round": grid.bytes_up / clients,
        "encrypt_seconds_per_client": r["encrypt-seconds-per-client"],
        "aggregate_seconds": r["aggregate-seconds"],
        "decrypt_seconds_per_client": r["decrypt-seconds-per-client"],
        "crypto_seconds": crypto,
        "messaging_seconds": seconds - crypto,
        "max_abs_error_vs_plain_mean": float(np.max(np.abs(got - expected))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--updates", nargs="+", default=["lora", "full"])
    parser.add_argument("--chunk-floats", type=int, default=262_144)
    parser.add_argument("--out", default="bench/results/he_overhead.json")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="he-bench-"))
    node = {
        "state-dir": str(tmp / "state"),
        "he-key-dir": str(tmp / "keys"),
    }  # the nodes' own folders
    rows = {}
    for kind in args.updates:
        floats = sum(v.size for v in updates(kind, args.clients)[0].values())
        plain = plain_round(kind, args.clients, node)
        chunked = he_round(kind, args.clients, node, args.chunk_floats, one_trip=False)
        enc = he_round(kind, args.clients, node, args.chunk_floats, one_trip=True)
        rows[kind] = {
            "floats": floats,
            "plain": plain,
            "he": enc,
            "he_chunked": chunked,
            "time_ratio": enc["seconds_per_round"] / plain["seconds_per_round"],
            "bytes_ratio": enc["bytes_per_client_round"] / plain["bytes_per_client_round"],
        }
        print(
            f"{kind:5s} {floats:>10,d} floats | plain {plain['seconds_per_round']:7.2f} s "
            f"{plain['bytes_per_client_round'] / 1e6:9.2f} MB | HE "
            f"{enc['seconds_per_round']:7.2f} s {enc['bytes_per_client_round'] / 1e6:9.2f} MB"
            f" (enc {enc['encrypt_seconds_per_client']:.2f} s/client, agg "
            f"{enc['aggregate_seconds']:.2f} s, dec {enc['decrypt_seconds_per_client']:.2f} "
            f"s/client) | time x{rows[kind]['time_ratio']:.1f}, bytes "
            f"x{rows[kind]['bytes_ratio']:.1f}, max err {enc['max_abs_error_vs_plain_mean']:.1e}",
            flush=True,
        )
        for name, row in (("one trip", enc), ("chunk phases", chunked)):
            print(
                f"      HE {name:12s}: {row['seconds_per_round']:7.2f} s = crypto {row['crypto_seconds']:.2f} s"
                f" + messaging and serialization {row['messaging_seconds']:.2f} s "
                f"(x{row['seconds_per_round'] / plain['seconds_per_round']:.1f} plain)",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"clients": args.clients, "updates": rows}, indent=2))


if __name__ == "__main__":
    main()
