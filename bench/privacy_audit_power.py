"""The privacy audit's power: how often FedTP's audit fails a release whose noise falls short of
its claim (docs/privacy-audit.md's power table).

For each claimed sigma and each shortfall f, ``--trials`` audit runs of FedTP's DP prior (the
real prior population, ``privacy.audit``'s defaults: 256 canaries, 95% over the run's checks,
one sweep release at the same sigma), the mechanism broken to draw its noise at sigma / f: the
share of runs the audit fails, by its canaries (the one-run bound above the accountant's
epsilon) and by its noise check (the release's noise against its sigma). f = 1 is the working
mechanism: the share is the audit's false alarms. The noise check's power from the chi-square
distribution, as each run's report writes it (for the prior's check alone; at f = 1 its significance),
is printed beside the measured one.

    .venv/bin/python bench/privacy_audit_power.py [--sigmas 0.5 1 2 4 8] [--shortfalls 1 1.1 1.25 1.5 2] \
        [--trials 60]
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.flower.messages import TaskIdentity
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy import dp as privacy
from fedsim.privacy.dp import NoiseSource
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import markdown_table
from fedsim_clients.fedtp_messages import VECTORS
from fedsim_experiments.fedtp.protocol import audit_releases
from fedsim_strategies.dp_mean import DPMean
from fedsim_tasks.topical_chat.dataset import load_conversations, load_topics, local_preference


class Nodes:
    """The part of a Grid DPMean's sampling reads: one node per prior client."""

    def __init__(self, n: int):
        self.n = n

    def get_node_ids(self) -> list[int]:
        return list(range(1, self.n + 1))


def prior_rows(root: str) -> np.ndarray:
    """p_c of every validation conversation: FedTP's prior clients in this data root."""
    topics = len(load_topics(root))
    return np.stack(
        [
            local_preference(c, topics)
            for c in load_conversations(root, ("valid_freq", "valid_rare"), None)
        ]
    )


@contextmanager
def noise_short_by(factor: float):
    """Every release draws its noise at its std / ``factor`` (1: the working mechanism)."""
    honest = privacy.gaussian_noise
    privacy.gaussian_noise = lambda rng, std, size: honest(rng, std / factor, size)
    try:
        yield
    finally:
        privacy.gaussian_noise = honest


def audit(cfg, rows: np.ndarray, sigma: float, noise: NoiseSource):
    """One audit run's report: the prior released at ``sigma`` with the audit's canaries, under a
    plan with ``noise``."""
    plan = PrivacyPlan(noise, int(cfg.seed), audit_canaries=int(cfg.privacy.audit.canaries))
    strategy = DPMean(noise_multiplier=sigma, **plan.strategy_args(("noise", "audit_canaries")))
    strategy.configure_train(
        1,
        ArrayRecord({VECTORS: Array(np.full(rows.shape[1], 1.0 / rows.shape[1]))}),
        ConfigRecord(),
        Nodes(len(rows)),
    )
    reply = Message(
        RecordDict(
            {
                ARRAYS: ArrayRecord({VECTORS: Array(rows)}),
                METRICS: MetricRecord({NUM_EXAMPLES: len(rows)}),
            }
        ),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    arrays, _ = strategy.aggregate_train(1, [reply])
    return audit_releases(cfg, plan, strategy, arrays[VECTORS].numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--shortfalls", type=float, nargs="+", default=[1.0, 1.1, 1.25, 1.5, 2.0])
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = (
        1,
        0,
        0,
    )  # messages outside a run
    root = str(resolve_data_root(None))
    rows = prior_rows(root)
    table, start = [], time.perf_counter()
    for i, sigma in enumerate(args.sigmas):
        cfg = compose(
            [
                "privacy.audit.enabled=true",
                f"strategy.noise_multiplier={sigma}",
                f"protocol.dp_sigmas=[{sigma}]",
                "protocol.dp_seeds=1",
                f"data_root={root}",
            ]
        )
        for j, factor in enumerate(args.shortfalls):
            with noise_short_by(
                factor
            ):  # secrets of their own, never the public seed's (entropy 0 is seed 0's)
                reports = [
                    audit(cfg, rows, sigma, NoiseSource(10**6 * (i + 1) + 10**3 * j + t + 1))
                    for t in range(args.trials)
                ]
            prior = [next(c for c in r.noise if c.release == "prior") for r in reports]
            chance = {
                1.0: prior[0].significance,
                **{p["shortfall"]: p["power"] for p in prior[0].power},
            }
            table.append(
                {
                    "sigma": sigma,
                    "shortfall": f"{factor:g}x",
                    "trials": args.trials,
                    "canaries fail it": float(
                        np.mean([not all(b.holds for b in r.bounds) for r in reports])
                    ),
                    "noise check fails it": float(
                        np.mean([not all(c.holds for c in r.noise) for r in reports])
                    ),
                    "audit fails it": float(np.mean([bool(r.failures()) for r in reports])),
                    "prior's check, chi-square": chance.get(factor, np.nan),
                    "epsilon_upper": reports[0].bounds[0].epsilon_upper,
                    "epsilon_lower, median": float(
                        np.median([r.bounds[0].epsilon_lower for r in reports])
                    ),
                }
            )
            print(f"sigma {sigma:g}, {factor:g}x: {time.perf_counter() - start:.0f} s", flush=True)
    print(
        f"\n## The audit's power, {len(rows)} prior clients + {cfg.privacy.audit.canaries} canaries, "
        f"{prior[0].coordinates} topics, {prior[0].significance:.4g} per check\n"
    )
    print(markdown_table(table, list(table[0]), digits=3))


if __name__ == "__main__":
    main()
