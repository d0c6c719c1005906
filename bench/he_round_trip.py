"""HE round vs plaintext round inside the real simulation (training included), one run.

``fedsim run experiment=fede4rag_paper`` with three federated methods only, the same KD-GLE
objective and budget: plaintext FedAvg (``fede4rag_no_he``), HEFedAvg in one trip (the LoRA
update encrypted in the train reply, the aggregate riding with the next round's messages) and
HEFedAvg through the chunk phases (``one_trip: false``, the earlier protocol). Evaluation is cut
to a small corpus (it is not part of a round). Prints seconds and MB per round and the ratios
against the plaintext round of the same run.

    .venv/bin/python bench/he_round_trip.py [--rounds 3]                      # Ray simulation
    .venv/bin/python bench/he_round_trip.py --rounds 2 hardware=deploy_local hardware.num_supernodes=null
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

FEDSIM = str(Path(sys.executable).parent / "fedsim")
METHODS = (
    "{fede4rag_no_he: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 1.0, he: false}, "
    "fede4rag: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 1.0, he: true}, "
    "fede4rag_chunked: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 1.0, he: true, "
    "one_trip: false}}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "overrides", nargs="*", help="more fedsim overrides, e.g. hardware=deploy_local"
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="he-round-trip-"))
    subprocess.run(
        [
            FEDSIM,
            "run",
            "experiment=fede4rag_paper",
            f"num_rounds={args.rounds}",
            "task.n_valid=4",
            "task.n_test=6",
            "task.corpus_pages_per_doc=8",
            "task.embedding_cache=null",
            f"task.he.key_dir={out / 'keys'}",
            f"client_state.dir={out / 'state'}",
            "~protocol.methods",
            f"+protocol.methods={METHODS}",
            f"results_dir={out / 'results'}",
            *args.overrides,
        ],
        check=True,
    )
    cost = json.loads((out / "results" / "results.json").read_text())["round_cost"]
    plain = cost["fede4rag_no_he"]
    print("| method | s / round | MB up / client | MB down / client | round / plaintext round |")
    print("|---|---|---|---|---|")
    for name, row in cost.items():
        print(
            f"| {name} | {row['seconds_per_round']:.1f} | {row['bytes_per_client_round'] / 1e6:.2f} | "
            f"{row.get('bytes_down_per_client_round', 0) / 1e6:.2f} | "
            f"{row['seconds_per_round'] / plain['seconds_per_round']:.2f} |"
        )
    traffic = json.loads((out / "results" / "results.json").read_text())["communication"]
    for phase, rounds in traffic.items():  # every exchange of the three methods, in seconds
        if phase.startswith("fede4rag"):
            print(phase, {r: round(row["seconds"], 1) for r, row in rounds.items()})


if __name__ == "__main__":
    main()
