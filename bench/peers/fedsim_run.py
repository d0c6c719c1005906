"""fedsim: the workload as ``fedsim run experiment=turn_sentiment_fedavg`` (its CLI, own SuperLink,
Flower's Ray simulation, the replies' checks, the journal; everything a user's run does), with
one SuperNode per client or ``--clients-per-supernode`` logical clients per SuperNode (their
replies stacked as rows with ``--client-backend batched``).

    python bench/peers/fedsim_run.py --clients 1000 --per-round 100 --rounds 3 --clients-per-supernode 100
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from workload import parser, report, setting

FEDSIM = str(Path(sys.executable).parent / "fedsim")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--clients-per-supernode", type=int, default=1)
    p.add_argument("--client-backend", default="messages", choices=["messages", "batched"])
    args = p.parse_args()
    s = setting(args)
    with tempfile.TemporaryDirectory(prefix="fedsim-peers-") as out:
        subprocess.run(
            [
                FEDSIM,
                "run",
                "experiment=turn_sentiment_fedavg",
                f"data_root={s.recipe.data_root}",
                f"hardware.num_clients={s.clients}",
                f"hardware.clients_per_supernode={args.clients_per_supernode}",
                f"hardware.client_backend={args.client_backend}",
                f"protocol.clients_per_round={s.per_round}",
                f"num_rounds={s.rounds}",
                f"seed={s.seed}",
                f"results_dir={out}",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        results = json.loads((Path(out) / "results.json").read_text())
    lost = sum(  # replies of the training exchanges not accepted: the work was not equal
        row["sent"] - row["accepted"]
        for phase, rounds in results["faults"].items()
        if phase.startswith("train/")
        for row in rounds.values()
    )
    report(
        results["round_seconds"],
        {k: results[k] for k in ("accuracy", "loss")},
        supernodes=results["supernodes"],
        replies_lost=lost,
    )


if __name__ == "__main__":
    main()
