"""The RLHF phase of FedBis / FedBiscuit (METHODS.md section 4), run in the ServerApp after the
selectors are trained.

1. Base policy: the configured causal LM (offline: the warm-started MiniLM decoder), taught to
   answer by SFT on Synthetic-Persona-Chat valid; its held-out loss on SPC test is reported.
   It is saved once under ``base_dir`` (keyed by its settings) and every client loads it.
2. Judge: a reward model trained centrally on the judge split only (never a client's pairs).
3. For each n in ``completions``: n sampled completions per server-held prompt from the base;
   every pair labelled by a method's selector (FedBis) or its selectors' majority vote
   (FedBiscuit); DPO of LoRA adapters on the labelled pairs.
4. Baselines through the clients: FedAvg (federated SFT on each client's preferred responses)
   and FedDPO (clients run DPO on their own pairs), Flower FedAvg of the adapters.
5. Each policy answers the held-out test prompts once; the judge compares every answer with the
   base policy's answer to the same prompt: win rate with a paired bootstrap 95% CI.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.code_policy import instantiate_allowed
from fedsim.results.stats import paired_bootstrap_ci
from fedsim.runtime.records import from_record, to_record
from fedsim.seeding import stream
from fedsim_clients import preference_messages as keys
from fedsim_experiments.fedbiscuit.settings import BASELINES, RLHF
from fedsim_strategies.selector_groups import majority_vote
from fedsim_tasks.causal_lm import (
    dpo_train,
    generate,
    load_policy,
    load_tokenizer,
    saved_sft_base,
    turn_separator,
)
from fedsim_tasks.hf import load_trainable, trainable_arrays
from fedsim_tasks.hh_preference.dataset import both_orders
from fedsim_tasks.hh_preference.rlhf import (
    ReversedJudge,
    SecondCriterionJudge,
    completion_pairs,
    hacking_point,
    labeller_accuracy,
    persona_chat_examples,
    policy_prompt,
    win_rate,
    wins,
    words,
)
from fedsim_tasks.hh_preference.rules import RuleJudge
from fedsim_tasks.hh_preference.selector import choices

log = logging.getLogger("fedsim")
# of the run's seed, the same for every method: the judge, the replies judged, the server's
# completions per n, the selectors' DPO
JUDGE_TRAINING, EVAL_SAMPLING = stream("judge-training"), stream("rlhf-eval-sampling")
COMPLETIONS, DPO_TRAINING = stream("rlhf-completions", "n"), stream("rlhf-dpo-training")


def base_policy(r: RLHF, data_root: str, seed: int) -> tuple[Path, dict]:
    """The SFT'd base, built once per settings (a key of them names its folder) and reused."""
    key = {
        k: getattr(r, k)
        for k in (
            "policy_model",
            "sft_steps",
            "sft_batch_size",
            "sft_lr",
            "sft_heldout",
            "context_turns",
            "max_length",
        )
    } | {"seed": seed}

    def data(sep: str):
        return (
            persona_chat_examples(data_root, "valid", sep, r.context_turns),
            persona_chat_examples(data_root, "test", sep, r.context_turns)[: r.sft_heldout],
            {
                "data": "Synthetic-Persona-Chat valid (User 2 turns as replies)",
                "heldout": f"Synthetic-Persona-Chat test, {r.sft_heldout} replies",
            },
        )

    return saved_sft_base(
        r.policy_model,
        r.base_dir,
        key,
        data,
        steps=r.sft_steps,
        batch_size=r.sft_batch_size,
        lr=r.sft_lr,
        max_length=r.max_length,
        seed=seed,
    )


def run_rlhf(ctx, selectors: dict[str, list[dict]], selector) -> dict:
    """The whole policy phase; ``selectors``: method -> trained selector weights."""
    r = RLHF(**OmegaConf.to_container(ctx.cfg.protocol.rlhf, resolve=True))
    torch.set_num_threads(r.server_threads)
    fed, seed = ctx.federation, int(ctx.cfg.seed)
    base_path, sft = base_policy(
        r, ctx.cfg.task.data_root, seed if r.base_seed is None else r.base_seed
    )
    tokenizer = load_tokenizer(base_path)
    sep = turn_separator(tokenizer)
    judge = instantiate(ctx.cfg.task.judge, seed=seed)
    log.info("[rlhf] judge: training on the %d judge pairs", len(fed.splits["judge"]))
    judge.train(
        both_orders(fed.splits["judge"]),
        r.judge_steps,
        ctx.cfg.protocol.batch_size,
        ctx.cfg.protocol.lr,
        JUDGE_TRAINING.seed(seed),
        ctx.cfg.protocol.weight_decay,
    )
    minority, judge_report = judges(
        judge, fed, ctx.cfg.task.minority_preference, selector, selectors
    )
    out = {"base": {"path": str(base_path), "sft": sft}, "judge": judge_report}
    eval_raw = [p.prompt for p in fed.splits["test"][: r.eval_prompts]]
    eval_prompts = [policy_prompt(p, sep, r.context_turns) for p in eval_raw]

    def judged(model) -> tuple[np.ndarray, list[str]]:
        replies = [
            c[0]
            for c in generate(
                model,
                tokenizer,
                eval_prompts,
                n=1,
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                seed=EVAL_SAMPLING.seed(seed),
            )
        ]
        return judge.scores(eval_raw, replies).detach().numpy(), replies

    base_model = load_policy(base_path)
    base = judged(base_model)
    scored: dict[tuple[str, str], tuple[np.ndarray, list[str]]] = {}

    def compare(model, method: str, n: str) -> dict:
        scores, replies = scored[method, n] = judged(model)
        return {
            **versus(scored[method, n], base, minority, r.bootstrap, seed),
            "mean_reward": float(scores.mean()),
            "example": replies[0],
        }

    server_raw = [p.prompt for p in fed.splits["server"]]
    server_prompts = [policy_prompt(p, sep, r.context_turns) for p in server_raw]
    as_policy = dict(zip(server_raw, server_prompts))
    labelled: dict[tuple[str, int], list[tuple[str, str, str]]] = {}
    policy: dict[str, dict] = {}
    for n in r.completions:
        samples = generate(
            base_model,
            tokenizer,
            server_prompts,
            n=n,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=COMPLETIONS.seed(seed, n=n),
        )
        for method in (m for m in r.selector_methods if m in selectors):
            start = time.perf_counter()
            pairs = completion_pairs(server_raw, samples, _labeller(selector, selectors[method]))
            labelled[method, n] = [(as_policy[x], c, rj) for x, c, rj in pairs]
            model = load_policy(base_path, dict(r.lora), seed)
            stats = dpo_train(
                model,
                tokenizer,
                labelled[method, n],
                steps=r.dpo_steps,
                batch_size=r.dpo_batch_size,
                lr=r.dpo_lr,
                beta=r.beta,
                max_length=r.max_length,
                seed=DPO_TRAINING.seed(seed),
            )
            accuracy = labeller_accuracy(pairs, judge, minority)
            policy.setdefault(method, {})[str(n)] = {
                **compare(model, method, str(n)),
                **{f"labeller_{k}": v for k, v in accuracy.items() if k != "pairs"},
                "pairs": len(pairs),
                "dpo": stats,
                "seconds": time.perf_counter() - start,
            }
            log.info(
                "[rlhf] %s n=%d: %d pairs, win rate %.3f vs base",
                method,
                n,
                len(pairs),
                policy[method][str(n)]["win_rate"],
            )
    if r.hacking_steps:
        out["reward_hacking"] = {}
        curved = r.selector_methods if r.hacking_methods is None else r.hacking_methods
        for method in (m for m in curved if (m, r.hacking_n) in labelled):
            labeller = _labeller(selector, selectors[method])

            def point(model, labeller=labeller) -> dict:
                scores, replies = judged(model)
                return hacking_point(
                    labeller, eval_raw, base[1], replies, scores, base[0], minority
                )

            out["reward_hacking"][method] = reward_hacking(
                load_policy(base_path, dict(r.lora), seed),
                tokenizer,
                labelled[method, r.hacking_n],
                r,
                seed,
                point,
            )
            log.info(
                "[rlhf] %s reward hacking: %s",
                method,
                ", ".join(
                    f"{p['steps']}: proxy {p['proxy_win_rate']:.2f} judge {p['judge_win_rate']:.2f}"
                    for p in out["reward_hacking"][method]
                ),
            )
    for name, objective in ((b, BASELINES[b]) for b in r.baselines):
        start = time.perf_counter()
        weights = _federated_policy(ctx, name, objective, base_path, r, seed)
        model = load_policy(base_path, dict(r.lora), seed)
        load_trainable(model, weights)
        policy[name] = {
            "clients": {**compare(model, name, "clients"), "seconds": time.perf_counter() - start}
        }
        log.info("[rlhf] %s: win rate %.3f vs base", name, policy[name]["clients"]["win_rate"])
    out["policy"] = {"raw": raw_rows(base, minority, policy, r.bootstrap, seed), **policy}
    out["head_to_head"] = head_to_head(scored, r.reference_method, minority, r.bootstrap, seed)
    return out


def versus(
    a: tuple[np.ndarray, list[str]],
    b: tuple[np.ndarray, list[str]],
    minority,
    resamples: int,
    seed: int,
) -> dict:
    """Replies ``a`` against replies ``b`` (judge scores, texts) on the same prompts: win rates
    for the majority's judge and the minority's."""
    return win_rate(
        wins(a[0], b[0]),
        resamples,
        seed,
        minority.wins(a[0], b[0], a[1], b[1]),
        words(a[1]) - words(b[1]),
    )


def raw_rows(
    base: tuple[np.ndarray, list[str]], minority, policy: dict, resamples: int, seed: int
) -> dict:
    """The base against itself (every reply ties: 0.5 by definition), under every n key the
    policies use, so ``fedsim compare sweep.baseline=raw`` pairs each policy's win rate with it."""
    row = {
        **versus(base, base, minority, resamples, seed),
        "mean_reward": float(base[0].mean()),
        "example": base[1][0],
    }
    return {n: dict(row) for n in dict.fromkeys(n for by_n in policy.values() for n in by_n)}


def judges(
    judge, fed, preference: DictConfig, selector, selectors: dict[str, list[dict]]
) -> tuple[object, dict]:
    """The minority's judge (its rule over the HH judge) and what the judges are worth: accuracy
    on the held-out test pairs for each population's labels, and how often the HH judge chooses
    as each method's labeller does (the judge should not read the selectors' features)."""

    def scored(population: str) -> tuple[list, np.ndarray, np.ndarray]:
        test = fed.test(population)  # a pair the minority flips comes in the other order here
        prompts = [e.prompt for e in test]
        return test, *(
            judge.scores(prompts, [getattr(e, side) for e in test]).detach().numpy()
            for side in "ab"
        )

    test, score_a, score_b = scored("majority")
    if preference.kind == "rules":  # the minority's rule itself: exact (issue 63)
        minority = RuleJudge(instantiate_allowed(fed.task["rules"]["minority"], "task.rules"))
    elif preference.kind == "reversed":
        minority = ReversedJudge()
    else:
        minority = SecondCriterionJudge.fit(
            score_b[::2] - score_a[::2], preference.weak_share, preference.prefer
        )
    own, own_a, own_b = scored("minority")
    prefers_b = {
        "majority": score_b > score_a,
        "minority": minority.wins(own_b, own_a, [e.b for e in own], [e.a for e in own]) > 0.5,
    }
    accuracy = {
        pop: float(np.mean(prefers_b[pop] == np.array([e.label for e in examples])))
        for pop, examples in (("majority", test), ("minority", own))
    }
    report = {
        "pairs": len(fed.splits["judge"]),
        "minority_judge": type(minority).__name__,
        "accuracy": accuracy["majority"],
        "accuracy_minority": accuracy["minority"],
        "agreement": {
            m: float(np.mean(prefers_b["majority"] == (_labeller(selector, w)(test) > 0.5)))
            for m, w in selectors.items()
        },
    }
    return minority, report


def reward_hacking(
    model,
    tokenizer,
    pairs: list[tuple[str, str, str]],
    r: RLHF,
    seed: int,
    point: Callable[[object], dict],
) -> list[dict]:
    """The policy trained by one DPO run of ``max(r.hacking_steps)`` steps on ``pairs`` (the
    selector-labelled policies' settings), scored by ``point`` before training and after each
    step in ``r.hacking_steps``: the proxy (its labellers) and the judge against the base."""
    marks, rows = set(r.hacking_steps), [{"steps": 0, **point(model)}]

    def after_step(step: int) -> None:
        if step in marks:
            rows.append({"steps": step, **point(model)})

    dpo_train(
        model,
        tokenizer,
        pairs,
        steps=max(marks),
        batch_size=r.dpo_batch_size,
        lr=r.dpo_lr,
        beta=r.beta,
        max_length=r.max_length,
        seed=DPO_TRAINING.seed(seed),
        after_step=after_step,
    )
    return rows


def head_to_head(
    scored: dict[tuple[str, str], tuple[np.ndarray, list[str]]],
    reference: str,
    minority,
    resamples: int,
    seed: int,
) -> dict:
    """Each policy against ``reference``'s policy with the same n, on the same prompts: how often
    its reply wins (for each population's judge), and the mean judge-reward difference, each
    with a paired bootstrap CI over prompts (a direct comparison; two win rates against the base
    do not make one)."""
    out = {}
    for (method, n), replies in scored.items():
        ref = scored.get((reference, n))
        if method == reference or ref is None:
            continue
        diff = replies[0] - ref[0]
        out.setdefault(method, {})[n] = {
            **versus(replies, ref, minority, resamples, seed),
            "reward_diff": float(diff.mean()),
            "reward_diff_ci": list(paired_bootstrap_ci(diff, resamples, seed)),
        }
    return out


def _labeller(selector, weights: list[dict]):
    """prefer_b for completion pairs: the one selector's choice, or the U selectors' majority vote."""
    return lambda examples: majority_vote(choices(selector, weights, examples))


def _federated_policy(ctx, name: str, objective: str, base_path, r: RLHF, seed: int) -> dict:
    """Flower FedAvg of the policy adapters, the clients training on their own pairs."""
    initial = trainable_arrays(load_policy(base_path, dict(r.lora), seed))
    config = {
        **ctx.base,
        keys.OBJECTIVE: objective,
        keys.POLICY_BASE: str(base_path),
        keys.POLICY: json.dumps(asdict(r)),
        keys.LOCAL_STEPS: r.baseline_steps,
        keys.BATCH_SIZE: r.dpo_batch_size,
        keys.LR: r.dpo_lr,
        keys.SEED: seed,
        keys.TORCH_THREADS: 1,
    }
    result = ctx.fedavg(
        f"rlhf-{name}",
        to_record(initial),
        r.baseline_rounds,
        config,
        ctx.cfg.protocol.fraction_train,
        ctx.train_reply,
    )
    return from_record(result.arrays)
