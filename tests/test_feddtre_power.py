"""What the FedDTRE power sweep reads (issue 41), on a tiny run played in process (the protocol's
ServerApp code and the real ClientApp handler behind an InProcessGrid, no Ray): real data (a
slice of Synthetic-Persona-Chat), the tiny BERT of ``fedsim_tasks/test_causal_lm.py`` as
generator and trust evaluator (no base SFT). Each client-round reports exactly the configured
number of scoring contexts, the standard error of s_g - s_l over them and its local model's
train and held-out nll; the scores come from the held-out dialogues or, as the paper's eq. 9
has it, the trust data; results.json and summary.md carry alpha against the overfitting gap."""

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.stats import pearsonr
from test_feddtre_personal import play

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.config.schema import check
from fedsim_clients.dialogue import DialogueClient
from fedsim_experiments.feddtre import report as feddtre_report
from fedsim_tasks.test_causal_lm import encoder_dir  # noqa: F401 (fixture: the tiny BERT of every model here)

CLIENTS, ROUNDS, SCORED, GAP = 2, 3, 5, 6
IID = f"{{_target_: flwr_datasets.partitioner.IidPartitioner, num_partitions: {CLIENTS}}}"
FEDDTRE = (
    "{_target_: fedsim_strategies.trust_alpha.TrustAlpha, k0: 0.7, k_growth: 0.1, midpoint: 0.0, "
    "alpha_min: 0.1, alpha_max: 1.0}"
)
SLICE = [
    "experiment=feddtre_power",
    data_root_override(),
    f"task.num_clients={CLIENTS}",
    "task.max_conversations=40",
    "~task.datasets.persona_chat.partitioner",
    f"+task.datasets.persona_chat.partitioner={IID}",
    "task.trust.contexts_per_client=8",
    "task.evaluator.max_length=32",
    "task.evaluator.response_length=16",
    "protocol.generator.base_sft_steps=0",
    "protocol.generator.max_length=48",
    "protocol.generator.local_steps=2",
    "protocol.generator.batch_size=2",
    f"protocol.generator.eval_contexts={SCORED}",
    f"protocol.generator.loss_gap_examples={GAP}",
    "protocol.generator.max_new_tokens=4",
    "protocol.test_contexts=2",
    "protocol.personal_contexts=2",
    f"protocol.clients_per_round={CLIENTS}",
    "protocol.evaluator.rounds=1",
    f"protocol.evaluator.clients_per_round={CLIENTS}",
    "protocol.evaluator.local_steps=1",
    "protocol.evaluator.heldout_contexts=3",
    f"num_rounds={ROUNDS}",
    "~protocol.methods",
    f"+protocol.methods={{feddtre: {{run: fedsim_experiments.feddtre.protocol.federated, strategy: {FEDDTRE}}}}}",
]


def _cfg(tiny, tmp, *extra):
    return compose(
        [
            *SLICE,
            f"task.evaluator.model={tiny}",
            f"protocol.generator.model={tiny}",
            f"results_dir={tmp / 'results'}",
            f"protocol.generator.base_dir={tmp / 'gen'}",
            f"client_state.dir={tmp / 'state'}",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def runs(encoder_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """The tiny run once per scoring source: its results.json and its output folder."""
    out = {}
    for scoring in ("heldout", "trust"):
        tmp = tmp_path_factory.mktemp(f"feddtre-{scoring}")
        cfg = _cfg(encoder_dir, tmp, f"protocol.generator.scoring={scoring}")
        out[scoring] = play(cfg, CLIENTS), tmp / "results"
    return out


@pytest.fixture(scope="module")
def leaking_run(encoder_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """The tiny run with client 1 leaking PII in every training reply: its results.json."""
    tmp = tmp_path_factory.mktemp("feddtre-leak")
    leak = ["task.contamination.clients=[1]", "task.contamination.share=1.0"]
    return play(_cfg(encoder_dir, tmp, *leak), CLIENTS)


def _rows(results: dict) -> list[dict]:
    return [
        row
        for rnd in results["alpha"]["feddtre"]["persona_chat"].values()
        for row in rnd["clients"]
    ]


@pytest.mark.parametrize("scoring", ["heldout", "trust"])
def test_every_client_round_scores_the_configured_contexts(runs, scoring):
    """Each client-round scored both models on exactly eval_contexts contexts (the reply is
    refused otherwise) and reports the standard error of s_g - s_l over them."""
    rows = _rows(runs[scoring][0])
    assert len(rows) == CLIENTS * ROUNDS
    assert all(r["scored-contexts"] == SCORED for r in rows)
    assert all(0 <= r["s-gap-se"] < 1 for r in rows), (
        rows
    )  # 0: the two models replied alike everywhere
    assert any(r["s-gap-se"] > 0 for r in rows), rows


def test_trust_dataset_scoring_reads_other_contexts_than_held_out_dialogues(runs):
    """The same run (seeds, models, rounds) scored on the trust data gives other trust scores
    than on the held-out dialogues: the option reaches the clients."""
    held, trust = (_rows(runs[s][0]) for s in ("heldout", "trust"))
    assert [r["s-local"] for r in held] != [r["s-local"] for r in trust]


def test_alpha_against_the_overfitting_gap_is_logged(runs):
    """Every client-round carries its local model's train and held-out nll; results.json's
    alpha_gap holds their mean gap and Pearson's r of alpha with it (as scipy computes it from
    the rows), summary.md its table and the run a scatter plot."""
    results, folder = runs["heldout"]
    rows = _rows(results)
    assert all(r["train-nll"] > 0 and r["heldout-nll"] > 0 for r in rows)
    gap = np.array([r["heldout-nll"] - r["train-nll"] for r in rows])
    alpha = np.array([r["alpha"] for r in rows])
    logged = results["alpha_gap"]["feddtre"]["persona_chat"]
    assert logged["client_rounds"] == CLIENTS * ROUNDS and logged["loss_gap_mean"] == pytest.approx(
        gap.mean()
    )
    assert logged["s_gap_se_mean"] == pytest.approx(np.mean([r["s-gap-se"] for r in rows]))
    assert np.ptp(alpha) > 0, (
        alpha
    )  # midpoint 0: any client whose global replies score higher earns more
    expected = pearsonr(alpha, gap)
    assert logged["pearson_r"] == pytest.approx(expected.statistic)
    assert (
        logged["unit"] == "client" and logged["clusters"] == CLIENTS
    )  # r's CI resamples clients, not rounds
    assert "ci" not in logged or -1 <= logged["ci"][0] <= logged["ci"][1] <= 1
    assert "alpha against the local model's overfitting" in (folder / "summary.md").read_text()
    assert (folder / "alpha_vs_gap.png").stat().st_size > 0


def test_the_leaking_clients_late_alpha_gap_is_in_the_results(leaking_run):
    """task.contamination's run: results.json's alpha_late is the leaking minus the clean
    client's mean alpha over rounds >= protocol.alpha_gap_from_round (2), from its alpha rows."""
    per_round = leaking_run["alpha"]["feddtre"]["persona_chat"]
    alphas = {int(rnd): v["clients"] for rnd, v in per_round.items()}
    late = leaking_run["contamination"]["methods"]["feddtre"]["persona_chat"]["alpha_late"]
    assert late == feddtre_report.late_alpha_gap(alphas, frozenset({1}), 2)
    leaking, clean = (
        np.mean(
            [r["alpha"] for rnd in range(2, ROUNDS + 1) for r in alphas[rnd] if r["partition"] == p]
        )
        for p in (1, 0)
    )
    assert late["from_round"] == 2 and late["gap"] == pytest.approx(leaking - clean)


def test_alpha_vs_gap_by_hand():
    """r of (0.1, 0.2, 0.3, 0.4) with gaps (1, 2, 3, 5): 0.9827; a constant alpha has none."""
    rows = {
        1: [
            {
                "partition": p,
                "alpha": a,
                "train-nll": 1.0,
                "heldout-nll": 1.0 + g,
                "s-local": 0.5,
                "s-global": 0.5 + a,
                "s-gap-se": 0.1,
            }
            for p, a, g in ((0, 0.1, 1), (1, 0.2, 2), (2, 0.3, 3), (3, 0.4, 5))
        ]
    }
    out = feddtre_report.alpha_vs_gap(rows, "client", seed=0)
    assert out["pearson_r"] == pytest.approx(0.98270, abs=1e-5) and out[
        "loss_gap_mean"
    ] == pytest.approx(2.75)
    assert out["share_beyond_2se"] == 0.5 and out["s_gap_se_mean"] == pytest.approx(
        0.1
    )  # 0.3, 0.4 > 0.2
    for r in rows[1]:
        r["alpha"] = 0.1
    assert "pearson_r" not in feddtre_report.alpha_vs_gap(rows, "client", seed=0)


def test_alpha_vs_gap_resamples_clients_not_rounds():
    """Twelve clients, ten rounds each that repeat the client's (alpha, gap) with jitter: r's CI
    is the bootstrap over the 12 clients (the unit), far wider than Fisher's z over 120 rounds."""
    rng = np.random.default_rng(5)
    clients = np.repeat(np.arange(12), 10)
    alpha = rng.normal(size=12)[clients] + rng.normal(0, 0.05, clients.size)
    gap = 0.3 * alpha + rng.normal(size=12)[clients] + rng.normal(0, 0.05, clients.size)
    rows = {
        rnd: [
            {"partition": int(c), "alpha": a, "train-nll": 1.0, "heldout-nll": 1.0 + g}
            for c, a, g in zip(clients[rnd::10], alpha[rnd::10], gap[rnd::10])
        ]
        for rnd in range(10)
    }
    out = feddtre_report.alpha_vs_gap(rows, "client", seed=0)
    assert (out["unit"], out["clusters"], out["client_rounds"]) == ("client", 12, 120)
    fisher = pearsonr(alpha, gap).confidence_interval(0.95)
    assert out["ci"][1] - out["ci"][0] > 2 * (fisher.high - fisher.low)


def test_no_loss_gap_under_dp_sgd(encoder_dir, tmp_path):  # noqa: F811
    """The training replies' nll, released as it is, would escape DP-SGD's guarantee."""
    generator = check(_cfg(encoder_dir, tmp_path, *DP)).generator
    assert generator.loss_gap_examples == GAP and generator.gap_examples() == 0


def test_trust_scoring_contexts_are_the_trust_data(encoder_dir, tmp_path):  # noqa: F811
    """A client's trust-source contexts are its trust data's true-reply contexts (drawn from its
    training conversations), never its held-out ones; the held-out source is its held-out replies."""
    cfg = _cfg(encoder_dir, tmp_path)
    client = DialogueClient(
        OmegaConf.to_container(cfg.task, resolve=True), str(resolve_data_root()), 0, CLIENTS
    )
    trust = client.scoring_contexts("persona_chat", " [SEP] ", "trust")
    assert [e.context for e in trust] == [
        t.context for t in client.trust_data() if t.kind == "true_reply"
    ]
    held_out = {e.conv_id for e in client.scoring_contexts("persona_chat", " [SEP] ", "heldout")}
    assert held_out == {c.conv_id for c in client.data["persona_chat"].valid}
    assert not {e.conv_id for e in trust} & held_out


DP = ["protocol.generator.dp_sgd.enabled=true", "protocol.generator.dp_sgd.noise_multiplier=1.0"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["protocol.generator.scoring=trusted"], "one of"),
        (["protocol.generator.eval_contexts=1"], "at least 2"),
        (["protocol.generator.eval_contexts=9"], "holds 8 trust contexts"),
        (["protocol.personal_contexts=500"], "heldout contexts"),
        (DP, "dp_sgd does not cover"),  # trust contexts are training contexts
    ],
)
def test_a_setting_no_client_can_honour_is_refused_before_the_run(
    encoder_dir,  # noqa: F811
    tmp_path,
    overrides,
    message,
):
    cfg = _cfg(encoder_dir, tmp_path, "protocol.generator.scoring=trust", *overrides)
    with pytest.raises(ValueError, match=message):
        check(cfg).check_run(cfg, CLIENTS)
