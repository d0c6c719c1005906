"""Can grouping help at all? A selector trained centrally on one population's pairs against the
selector trained on every client's pairs (pooled), each scored on that population's held-out
test pairs. If the population's own selector does not beat the pooled one, no grouping of
clients (FedBiscuit's, or the oracle's) can help in that setting.

For each minority preference (``task.minority_preference.kind``) and seed (``seed`` and
``task.split_seed`` both: another split, partition and minority draw), in this process, no
Flower: ``fedbiscuit_paper``'s task and central training (``protocol.central_steps``). Also two
judges trained on the judge split only, both reading the prompt's last Human turn with the
response: the MiniLM scorer (the selectors' features) and a TF-IDF scorer (another model
family); their test accuracy for the majority (HH) and how often they choose as each selector
does. Prints the per-seed rows and, per population, own minus pooled over seeds with its t
interval and verdict (``fedsim/results/stats.py``); writes everything as JSON.

    .venv/bin/python bench/fedbiscuit_populations.py --seeds 0 1 2 --output populations.json
    .venv/bin/python bench/fedbiscuit_populations.py --kinds second_criterion \
        --overrides task.minority_preference.weak_share=1.0 --output length.json
"""

from __future__ import annotations

import argparse
import json
import time
from functools import lru_cache

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedsim.config.compose import compose_checked
from fedsim.results.stats import t_interval, verdict
from fedsim_experiments.fedbiscuit.protocol import evaluate_selectors, train_central
from fedsim_experiments.fedbiscuit.rlhf import JUDGE_TRAINING
from fedsim_tasks.hh_preference.dataset import Federation, both_orders
from fedsim_tasks.hh_preference.selector import ScorerSelector, TfidfScorer, choices

POPULATIONS = ("majority", "minority")
EFFECT = 0.02  # fedbiscuit_paper's stated selector effect: two points of held-out accuracy


@lru_cache(maxsize=1)
def judges(seed: int) -> dict:
    """The two judges of one seed's split (the same for every minority preference), trained on
    the judge split as the RLHF phase trains its judge."""
    cfg = compose_checked(
        ["experiment=fedbiscuit_paper", f"seed={seed}", f"task.split_seed={seed}"]
    )
    fed = Federation(OmegaConf.to_container(cfg.task, resolve=True), cfg.data_root)
    p = cfg.protocol
    out = {
        "minilm": ScorerSelector(cfg.task.selector.model, frozen=True, human_words=32, seed=seed),
        "tfidf": TfidfScorer(human_words=32, seed=seed),
    }
    for judge in out.values():
        judge.train(
            both_orders(fed.splits["judge"]),
            p.rlhf.judge_steps,
            p.batch_size,
            p.lr,
            JUDGE_TRAINING.seed(seed),
            p.weight_decay,
        )
    return out


def judge_choices(judge, examples) -> np.ndarray:
    scores = (
        judge.margins(examples)
        if isinstance(judge, TfidfScorer)
        else judge.logits(examples).detach().numpy()
    )
    return (scores > 0).astype(int)


def one_seed(kind: str, seed: int, selector, initial: dict, overrides: list[str]) -> dict:
    """Own-population and pooled selectors, and the judges, on one seed's split."""
    cfg = compose_checked(
        [
            "experiment=fedbiscuit_paper",
            f"seed={seed}",
            f"task.split_seed={seed}",
            f"task.minority_preference.kind={kind}",
            *overrides,
        ]
    )
    task = OmegaConf.to_container(cfg.task, resolve=True)
    fed = Federation(task, task["data_root"])
    clients = [fed.client(p) for p in range(fed.num_clients)]
    train = {"pooled": [e for c in clients for e in c.train]}
    train |= {
        pop: [e for c in clients if c.population == pop for e in c.train] for pop in POPULATIONS
    }
    weights = {}
    for name, examples in train.items():
        selector.load(initial)
        train_central(selector, examples, cfg)
        weights[name] = selector.weights()
    test = fed.test()
    flipped = np.array([e.pair_id in fed.flips for e in test])
    picks = dict(zip(weights, choices(selector, list(weights.values()), test)))
    row = {
        "kind": kind,
        "overrides": overrides,
        "seed": seed,
        "train_pairs": {k: len(v) // 2 for k, v in train.items()},
        "minority_disagrees": float(flipped.mean()),
        "accuracy": {
            name: {
                pop: evaluate_selectors(selector, [w], fed, 0.0)[f"accuracy_{pop}"]
                for pop in POPULATIONS
            }
            for name, w in weights.items()
        },
    }
    majority = np.array([e.label for e in test])
    row["judges"] = {}
    for name, judge in judges(seed).items():
        choice = judge_choices(judge, test)
        row["judges"][name] = {
            "accuracy_majority": float(np.mean(choice == majority)),
            "agreement": {s: float(np.mean(choice == pick)) for s, pick in picks.items()},
        }
    return row


def summary(rows: list[dict]) -> dict:
    """Per kind and population: own-population minus pooled accuracy over seeds."""
    out = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        for pop in POPULATIONS:
            diff = np.array(
                [
                    r["accuracy"][pop][pop] - r["accuracy"]["pooled"][pop]
                    for r in rows
                    if r["kind"] == kind
                ]
            )
            ci = t_interval(diff, 0.95)
            out[f"{kind}/{pop}"] = {
                "n": int(diff.size),
                "own_minus_pooled": float(diff.mean()),
                "ci": ci,
                "verdict": verdict(ci, EFFECT),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["second_criterion", "reversed"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--output", default="fedbiscuit_populations.json")
    ap.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        help="more fedbiscuit_paper overrides, e.g. task.minority_preference.weak_share=1.0",
    )
    args = ap.parse_args()
    cfg = compose_checked(["experiment=fedbiscuit_paper"])
    selector = instantiate(
        cfg.task.selector, seed=cfg.task.seed
    )  # one instance: its embedding cache is shared
    initial = selector.weights()
    rows, start = [], time.perf_counter()
    for (
        seed
    ) in args.seeds:  # seeds outside: a seed's topics, embeddings and judges serve every kind
        for kind in args.kinds:
            rows.append(one_seed(kind, seed, selector, initial, args.overrides))
            print(json.dumps(rows[-1]), flush=True)
            result = {
                "rows": rows,
                "summary": summary(rows),
                "seconds": time.perf_counter() - start,
            }
            with open(
                args.output, "w"
            ) as fh:  # after every row: a stopped run keeps what it measured
                json.dump(result, fh, indent=1)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
