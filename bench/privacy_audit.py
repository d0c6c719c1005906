"""The privacy audit's measured lower bounds beside the accountants' epsilons, against sigma
(docs/privacy-audit.md's tables; the plot is written beside them, not kept in docs: its FedTP input,
an audited run, is not a kept record).

(a) FedTP's DPMean, client level: read from the results.json of
    ``fedsim run experiment=fedtp_paper privacy.audit.enabled=true`` (``--fedtp``).
(b) DP-SGD, record level: private SFT (``fedsim_tasks.causal_lm.sft_train`` under DP-SGD) of a
    tiny causal LM (a 2-layer BERT decoder with LoRA, as the tests build it) on real
    Synthetic-Persona-Chat replies, with gradient canaries sampled beside the records, at each
    sigma: the reported epsilon (a record replaced) and the audit's bound from every step's noised gradient.

Prints both tables (markdown), an ideal attacker's bound on the same Gaussian mechanism (the reference
for FedTP's), and writes the plot of both bounds against sigma.

    .venv/bin/python bench/privacy_audit.py --fedtp <results_dir> [--sigmas 0.5 1 2 4] [--seed 0] \
        [--out privacy_audit.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from transformers import BertConfig, BertModel

from fedsim.config.data import resolve_data_root
from fedsim.privacy.audit import (
    BOUND_COLUMNS,
    AuditReport,
    Bound,
    audit_release,
    fair_coins,
    noise_check,
)
from fedsim.privacy.secagg import ddp
from fedsim.results.outputs import markdown_table
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, prepare_base, sft_train
from fedsim_tasks.dialogue.dataset import examples, persona_chat
from fedsim_tasks.dp_sgd import DP_EPSILON, DPSGD, GradientCanaries

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}


def fedtp_bounds(results_dir: Path) -> list[Bound]:
    rows = json.loads((results_dir / "results.json").read_text())["privacy"]["audit"]["releases"]
    names = {f.name for f in dataclasses.fields(Bound)}
    return [
        Bound(
            **{
                k: (math.inf if k == "epsilon_upper" and v is None else v)
                for k, v in row.items()
                if k in names
            }
        )
        for row in rows
    ]


def ideal_gaussian_bounds(
    sigmas: list[float],
    canaries: int,
    significance: float,
    delta: float,
    shares: list[float],
    trials: int,
    seed: int,
) -> list[dict]:
    """The bound an ideal attacker reaches on a Gaussian mechanism with Dirac canaries (each canary's
    coordinate is b + sigma z, b its coin) at an audit's settings, over ``trials`` runs: the
    reference that tells a weak attack from the one-run method's own looseness at a few hundred
    canaries."""
    rng, rows = np.random.default_rng(seed), []
    for sigma in sigmas:
        lows = []
        for _ in range(trials):
            included = fair_coins(canaries, rng)
            scores = included + sigma * rng.standard_normal(canaries)
            lows.append(
                audit_release(
                    "ideal",
                    sigma,
                    {"ideal": scores},
                    included,
                    math.inf,
                    delta,
                    significance,
                    1 - significance,
                    shares,
                ).epsilon_lower
            )
        rows.append(
            {
                "noise_multiplier": sigma,
                "median": float(np.median(lows)),
                "p5": float(np.percentile(lows, 5)),
                "p95": float(np.percentile(lows, 95)),
            }
        )
    return rows


def tiny_lm(folder: Path):
    """A tiny BERT (2 layers, hidden 32) as a causal decoder with LoRA, as the tests build it."""
    tokenizer = load_tokenizer("all-MiniLM-L6-v2")
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(folder / "encoder")
    tokenizer.save_pretrained(folder / "encoder")
    return prepare_base(str(folder / "encoder"), folder / "base", seed=0)


def dp_sgd_bound(
    base,
    records: list[tuple[str, str]],
    sigma: float,
    canaries: int,
    steps: int,
    batch_size: int,
    delta: float,
    confidence: float,
    shares: list[float],
    seed: int,
) -> tuple[Bound, float]:
    """One private SFT at ``sigma`` with ``canaries`` gradient canaries: its bound, and its seconds.
    ``seed`` draws the coins, the batches and the noise (a benchmark's figures are reproduced; a
    client's are not: fedsim_tasks/dp_sgd.py)."""
    model, tokenizer = load_policy(base, LORA, seed=0), load_tokenizer(base)
    audit = GradientCanaries(canaries, np.random.default_rng(seed))
    dp = DPSGD(
        enabled=True, max_grad_norm=0.1, noise_multiplier=sigma, target_epsilon=None, delta=delta
    )
    start = time.perf_counter()
    stats = sft_train(
        model,
        tokenizer,
        records,
        steps=steps,
        batch_size=batch_size,
        lr=1e-2,
        max_length=64,
        seed=0,
        dp=dp,
        noise_seed=seed,
        canaries=audit,
    )
    rate = batch_size / len(records)
    bound = audit_release(
        f"dp-sgd sigma {sigma:g}",
        sigma,
        {"every step's noised gradient": audit.scores(rate, sigma)},
        audit.included,
        stats[DP_EPSILON],
        delta,
        1 - confidence,
        confidence,
        shares,
    )
    return bound, time.perf_counter() - start


def ddp_bounds(
    sigmas: list[float],
    clients: int,
    canaries: int,
    scale_bits: int,
    delta: float,
    confidence: float,
    shares: list[float],
    seed: int,
) -> list[dict]:
    """The audit of distributed DP (``privacy=secagg_ddp``) at each sigma: ``clients`` clients'
    simplex rows and ``canaries`` canary clients (row C e_j on its secret coin, else 0: replace-one,
    one coordinate each) encoded as the protocol's clients encode them (``ddp.encode_rows``: clip,
    integers, a Skellam share sized for all of them), summed mod 2^32 as SecAgg+'s unmasked sum
    is (the masks cancel: ``fedsim/privacy/secagg/test_protocol.py``). The attacker sees the sum
    and knows every other client's integer row; it scores a canary by its coordinate minus the
    known sum, less B / 2. Beside each bound: the accountant's epsilon of the noise present and
    the sum's noise against sigma (chi-square). Bonferroni over the sigmas."""
    rng = np.random.default_rng(seed)
    dim, bound = 2 * canaries, 2**scale_bits
    rows = rng.dirichlet(np.ones(dim), size=clients)
    out = []
    for sigma in sigmas:
        plan = ddp.NoisePlan(sigma, bound, clients + canaries)
        coins = fair_coins(canaries, rng)
        canary_rows = np.eye(dim)[:canaries] * coins[:, None]
        known = np.zeros(dim, np.int64)
        total = np.zeros(dim + 1, np.uint32)
        for row in rows:
            state = rng.bit_generator.state
            known += ddp.integer_row(row, 1.0, bound, True, rng)
            rng.bit_generator.state = state  # the attacker knows the rounding, not the noise
            total = total + ddp.encode_rows(row[None, :], 1.0, True, plan, rng)
        for row in canary_rows:
            total = total + ddp.encode_rows(row[None, :], 1.0, True, plan, rng)
        _, noised = ddp.decode_sum(total)
        exact = known + bound * canary_rows.sum(axis=0).astype(np.int64)
        variance = plan.present_variance(clients + canaries)
        upper = ddp.skellam_epsilon([variance], *ddp.sensitivities(bound, dim, True), delta)
        significance = (1 - confidence) / len(sigmas)
        scores = (noised - known)[:canaries] - bound / 2
        row = audit_release(
            f"distributed dp sigma {sigma:g}",
            sigma,
            {"noised sum minus the known rows": scores},
            coins,
            upper.reported,
            delta,
            significance,
            confidence,
            shares,
        ).as_dict()
        check = noise_check("ddp", sigma, (noised - exact) / bound, significance)
        out.append({**row, "noise_measured": check.measured, "noise_holds": check.holds})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fedtp", type=Path, help="results_dir of an audited fedtp_paper run")
    parser.add_argument(
        "--ddp", action="store_true", help="audit distributed DP (secagg_ddp) only, and stop"
    )
    parser.add_argument("--ddp-clients", type=int, default=1000)
    parser.add_argument("--scale-bits", type=int, default=16)
    parser.add_argument("--ddp-out", type=Path, help="write the --ddp table's rows here (JSON)")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--canaries", type=int, default=500)
    parser.add_argument(
        "--seed", type=int, default=0, help="the DP-SGD runs' coins, batches and noise"
    )
    parser.add_argument(
        "--ideal-trials", type=int, default=100, help="trials of the ideal attacker's reference"
    )
    parser.add_argument("--out", type=Path, default=Path("privacy_audit.png"))
    args = parser.parse_args()
    if args.ddp:
        rows = ddp_bounds(
            args.sigmas,
            args.ddp_clients,
            args.canaries,
            args.scale_bits,
            1e-5,
            0.95,
            [0.1, 0.25, 0.5, 1.0],  # conf/config.yaml's privacy.audit.guess_shares
            args.seed,
        )
        print(markdown_table(rows, [*BOUND_COLUMNS, "noise_measured", "noise_holds"]))
        if args.ddp_out:
            args.ddp_out.parent.mkdir(parents=True, exist_ok=True)
            args.ddp_out.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
        return
    if args.fedtp is None:
        parser.error("--fedtp is required (or --ddp)")
    torch.set_num_threads(1)
    fedtp = fedtp_bounds(args.fedtp)
    conversations = persona_chat(str(resolve_data_root(None)), "valid")
    records = [
        (e.prompt, f" {e.reply}")
        for e in examples(conversations, " [SEP] ", 2, 40, ["User 2"], "Persona")
    ]
    records = records[: args.records]
    with tempfile.TemporaryDirectory() as folder:
        base = tiny_lm(Path(folder))
        dp_sgd = []
        for sigma in args.sigmas:
            bound, seconds = dp_sgd_bound(
                base,
                records,
                sigma,
                args.canaries,
                args.steps,
                args.batch_size,
                fedtp[0].delta,
                fedtp[0].confidence,
                [0.1, 0.25, 0.5, 1.0],
                args.seed,
            )
            print(f"DP-SGD sigma {sigma:g}: {seconds:.0f} s", flush=True)
            dp_sgd.append(bound)
    print(
        f"\n## FedTP DPMean (client level)\n\n{markdown_table([b.as_dict() for b in fedtp], BOUND_COLUMNS, digits=3)}"
    )
    # the FedTP run's share of 1 - confidence per attack: its releases x its two attackers
    ideal = ideal_gaussian_bounds(
        sorted({b.noise_multiplier for b in fedtp}),
        fedtp[0].canaries,
        (1 - fedtp[0].confidence) / (2 * len(fedtp)),
        fedtp[0].delta,
        [0.1, 0.25, 0.5, 1.0],
        args.ideal_trials,
        args.seed,
    )
    print(
        f"\n## An ideal attacker on the same Gaussian mechanism, {args.ideal_trials} trials\n\n"
        f"{markdown_table(ideal, ['noise_multiplier', 'median', 'p5', 'p95'], digits=2)}"
    )
    print(
        f"\n## DP-SGD, tiny causal LM, {len(records)} records, rate {args.batch_size / len(records):g}, "
        f"{args.steps} steps (record level)\n\n{markdown_table([b.as_dict() for b in dp_sgd], BOUND_COLUMNS, digits=3)}"
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    sweep = [
        b for b in fedtp if b.release != "prior"
    ]  # the prior is one of the sweep's sigmas again
    for ax, bounds, title in (
        (axes[0], sweep, "FedTP DPMean release (client level)"),
        (axes[1], dp_sgd, f"DP-SGD, tiny causal LM, {args.steps} steps (record level)"),
    ):
        AuditReport(bounds, "").plot(ax)
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
