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
            "loss",
        ],
    )
    return f"# {results['experiment']}\n\n{table}\n"
