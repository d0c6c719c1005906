"""What the rule-defined preferences of ``experiment=fedbiscuit_rules`` (issue 63) do on the real
HH-RLHF pairs: per rule, the share of pairs it decides (the rest are ties, dropped), how often it
picks HH's chosen reply, how often the longer reply (0.5: blind to length; Wilson 95% interval)
and the point-biserial correlation of its score with the reply's words; the two rules' agreement
where both decide. No model, no Flower; seconds.

    .venv/bin/python bench/fedbiscuit_rules.py --output rules.json
"""

from __future__ import annotations

import argparse
import json

from hydra.utils import instantiate

from fedsim.config.compose import compose_checked
from fedsim_tasks.hh_preference.dataset import load_pairs
from fedsim_tasks.hh_preference.rules import rule_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="JSON file to write")
    args = parser.parse_args()
    cfg = compose_checked(["experiment=fedbiscuit_rules"])
    rules = {population: instantiate(spec) for population, spec in cfg.task.rules.items()}
    report = rule_report(load_pairs(cfg.task.data_root), rules)
    report["rules"] = {population: type(rule).__name__ for population, rule in rules.items()}
    for population in rules:
        r = report[population]
        print(
            f"{population} ({report['rules'][population]}): decides {r['decisive']} of "
            f"{report['pairs']} ({r['decisive_share']:.3f}), agrees with HH {r['agrees_with_hh']:.3f}, "
            f"prefers the longer {r['prefers_longer']:.3f} [{r['prefers_longer_ci'][0]:.3f}, "
            f"{r['prefers_longer_ci'][1]:.3f}] of {r['length_pairs']}, score-words r "
            f"{r['score_words_r']:+.3f}"
        )
    both = report["agreement"]["majority/minority"]
    print(f"both decide {both['both_decisive']}: agree {both['agree']:.3f}")
    with open(args.output, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
