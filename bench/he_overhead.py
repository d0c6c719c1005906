"""HE overhead of one FedAvg round: CKKS (HEFedAvg) vs plaintext (Flower FedAvg), measured in
the same run for LoRA-only and full-model MiniLM updates.

Clients are in-process handlers that return a perturbed copy of the real model's trainable
weights (training is left out: it costs the same with or without HE); messages go through
Flower's protobuf wire format (``InProcessGrid``), so bytes are message sizes.

    .venv/bin/python bench/he_overhead.py [--clients 2] [--updates lora full]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.he import ckks as he
from fedsim.privacy.he import messages as keys
from fedsim.privacy.he.client import HEClient
from fedsim.privacy.he.layer import flatten
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_strategies.he_fedavg import HEFedAvg
from fedsim_tasks.hf import build_encoder, trainable_arrays

LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["query", "value"]}


def _updates(kind: str, clients: int) -> list[dict]:
    base = trainable_arrays(build_encoder("all-MiniLM-L6-v2", 128, LORA if kind == "lora"
                                          else None, seed=0))
    rng = np.random.default_rng(0)
    return [{k: (v + 1e-3 * rng.standard_normal(v.shape)).astype(np.float32)
             for k, v in base.items()} for _ in range(clients)]


def plain_round(updates: list[dict]) -> dict:
    def handler(weights):
        def reply(msg):
            return RecordDict({ARRAYS: ArrayRecord({k: Array(v) for k, v in weights.items()}),
                               METRICS: MetricRecord({NUM_EXAMPLES: 100})})
        return reply
    grid = InProcessGrid({i + 1: handler(u) for i, u in enumerate(updates)}, keep_replies=False)
    start = time.perf_counter()
    FedAvg(fraction_evaluate=0.0, min_available_nodes=len(updates),
           min_train_nodes=len(updates)).start(
        grid, ArrayRecord({k: Array(v) for k, v in updates[0].items()}), num_rounds=1)
    return {"seconds_per_round": time.perf_counter() - start,
            "bytes_per_client_round": grid.bytes_up / len(updates)}


def he_round(updates: list[dict], chunk_floats: int, one_trip: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="he-bench-"))
    params = he.CKKSParams()

    def handler(i, weights):
        client = HEClient(params, str(tmp / "keys"), tmp / f"node{i}")
        client.folder.mkdir(parents=True)
        flat = flatten(weights)

        def reply(msg):
            if msg.metadata.message_type == MessageType.TRAIN:
                return client.train_reply(flat, {NUM_EXAMPLES: 100},
                                          int(msg.content[keys.CONFIG][keys.INLINE_FLOATS]))
            return client.handle(msg)
        return reply
    grid = InProcessGrid({i + 1: handler(i, u) for i, u in enumerate(updates)},
                         keep_replies=False)
    strategy = HEFedAvg(FedAvg(min_available_nodes=len(updates), min_train_nodes=len(updates)),
                        chunk_floats=chunk_floats, one_trip=one_trip)
    start = time.perf_counter()
    strategy.start(grid, ArrayRecord(), num_rounds=1, train_config=ConfigRecord())
    seconds = time.perf_counter() - start
    r = strategy.rounds[1]
    n = len(updates)  # in-process handlers run one after another: client seconds add up
    crypto = n * (r["encrypt-seconds-per-client"] + r["decrypt-seconds-per-client"]) + r["aggregate-seconds"]
    expected = np.mean([flatten(u) for u in updates], axis=0)
    got = np.load(tmp / "node0" / "global-1.npy")  # node 0's complete round-1 aggregate
    return {"seconds_per_round": seconds, "bytes_per_client_round": grid.bytes_up / len(updates),
            "encrypt_seconds_per_client": r["encrypt-seconds-per-client"],
            "aggregate_seconds": r["aggregate-seconds"],
            "decrypt_seconds_per_client": r["decrypt-seconds-per-client"],
            "crypto_seconds": crypto, "messaging_seconds": seconds - crypto,
            "max_abs_error_vs_plain_mean": float(np.max(np.abs(got - expected)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--updates", nargs="+", default=["lora", "full"])
    parser.add_argument("--chunk-floats", type=int, default=262_144)
    parser.add_argument("--out", default="bench/results/he_overhead.json")
    args = parser.parse_args()
    rows = {}
    for kind in args.updates:
        updates = _updates(kind, args.clients)
        floats = sum(v.size for v in updates[0].values())
        plain = plain_round(updates)
        chunked = he_round(updates, args.chunk_floats, one_trip=False)
        enc = he_round(updates, args.chunk_floats, one_trip=True)
        rows[kind] = {"floats": floats, "plain": plain, "he": enc, "he_chunked": chunked,
                      "time_ratio": enc["seconds_per_round"] / plain["seconds_per_round"],
                      "bytes_ratio": enc["bytes_per_client_round"] /
                      plain["bytes_per_client_round"]}
        print(f"{kind:5s} {floats:>10,d} floats | plain {plain['seconds_per_round']:7.2f} s "
              f"{plain['bytes_per_client_round'] / 1e6:9.2f} MB | HE "
              f"{enc['seconds_per_round']:7.2f} s {enc['bytes_per_client_round'] / 1e6:9.2f} MB"
              f" (enc {enc['encrypt_seconds_per_client']:.2f} s/client, agg "
              f"{enc['aggregate_seconds']:.2f} s, dec {enc['decrypt_seconds_per_client']:.2f} "
              f"s/client) | time x{rows[kind]['time_ratio']:.1f}, bytes "
              f"x{rows[kind]['bytes_ratio']:.1f}, max err {enc['max_abs_error_vs_plain_mean']:.1e}",
              flush=True)
        for name, row in (("one trip", enc), ("chunk phases", chunked)):
            print(f"      HE {name:12s}: {row['seconds_per_round']:7.2f} s = crypto {row['crypto_seconds']:.2f} s"
                  f" + messaging and serialization {row['messaging_seconds']:.2f} s "
                  f"(x{row['seconds_per_round'] / plain['seconds_per_round']:.1f} plain)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"clients": args.clients, "updates": rows}, indent=2))


if __name__ == "__main__":
    main()
