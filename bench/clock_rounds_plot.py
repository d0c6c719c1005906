"""Virtual time per round on the clock: the synchronous rounds and FedBuff's server steps of a
sweep over ``strategy=fedavg,fedbuff`` (``docs/clock.md``), from its runs' ``results.json`` (the ``clock`` block and the
turn-sentiment curve), for one seed: each round's virtual duration, and the test loss against
virtual time.

    .venv/bin/python bench/clock_rounds_plot.py SWEEP [--seed 0] [--out docs/clock_virtual_time.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after the backend)


def run_of(sweep: Path, strategy: str, seed: int) -> dict:
    """The results of the sweep's completed run of ``strategy`` and ``seed``."""
    for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
        wanted = {f"strategy={strategy}", f"seed={seed}"}
        if run["status"] == "completed" and wanted <= set(run["overrides"]):
            return json.loads((sweep / run["name"] / "results.json").read_text())
    raise SystemExit(f"{sweep}: no completed run of strategy={strategy} seed={seed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/clock_virtual_time.png"))
    args = parser.parse_args()
    fig, (steps, curve) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    for name, strategy in (("synchronous FedAvg", "fedavg"), ("FedBuff", "fedbuff")):
        results = run_of(args.sweep, strategy, args.seed)
        rounds = results["clock"]["rounds"]
        steps.bar(
            [r["round"] + (0.2 if name == "FedBuff" else -0.2) for r in rounds],
            [r["virtual_end"] - r["virtual_start"] for r in rounds],
            width=0.4,
            label=name,
        )
        points = results["curve"]
        curve.plot(
            [p["virtual_time"] for p in points], [p["loss"] for p in points], marker=".", label=name
        )
        target = results.get("virtual_time_to_target")
        if target is not None:
            curve.axvline(target, linestyle=":", color=curve.lines[-1].get_color())
    steps.set(
        xlabel="round / server step", ylabel="virtual seconds", title="virtual time per round"
    )
    curve.set(
        xlabel="virtual seconds", ylabel="test loss", title="test loss (dotted: target reached)"
    )
    steps.legend()
    curve.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
