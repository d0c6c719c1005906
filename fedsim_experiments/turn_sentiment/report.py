"""Turn sentiment's report: the table of ``summary.md``, from a run's results (the protocol that
produced them: ``protocol.py``)."""

from __future__ import annotations

from fedsim.results.outputs import markdown_table


def summary(results: dict) -> str:
    table = markdown_table(
        [results],
        [
            "clients",
            "supernodes",
            "clients_per_round",
            "rounds",
            "seconds_per_round",
            "accuracy",
            "balanced_accuracy",
            "macro_f1",
            "loss",
        ],
    )
    curve = markdown_table(
        results["curve"], ["round", "accuracy", "balanced_accuracy", "macro_f1", "loss"]
    )
    return (
        f"# {results['experiment']}\n\n{table}\n\n"
        f"Test metrics after each round (round 0: the initial model):\n\n{curve}\n"
    )
