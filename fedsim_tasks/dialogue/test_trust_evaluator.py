"""The trust evaluator: BERTScore F1 against a hand computation, training and AUC on a tiny BERT."""

import numpy as np
import pytest
import torch

from fedsim_tasks.dialogue.trust_data import TrustExample
from fedsim_tasks.dialogue.trust_evaluator import TrustEvaluator, bertscore
from fedsim_tasks.test_causal_lm import encoder_dir, one_thread  # noqa: F401 (fixtures)


def test_bertscore_by_hand():
    # context tokens x1 = (1, 0), x2 = (0, 1), x3 = padding; response tokens r1 = (1, 1), r2 = (1, 0)
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])
    r = torch.tensor([[[1.0, 1.0], [2.0, 0.0]]])
    p, rec, f = bertscore(x, torch.tensor([[1, 1, 0]]), r, torch.tensor([[1, 1]]))
    c = 1 / np.sqrt(2)  # cos(x1, r1) = cos(x2, r1); cos(x1, r2) = 1; cos(x2, r2) = 0
    recall = (max(c, 1.0) + max(c, 0.0)) / 2  # each context token's best response token
    precision = (max(c, c) + max(1.0, 0.0)) / 2  # each response token's best context token
    assert rec.item() == pytest.approx(recall) and p.item() == pytest.approx(precision)
    assert f.item() == pytest.approx(2 * precision * recall / (precision + recall))


def test_bertscore_is_batched_and_scores_an_empty_reply_zero():
    torch.manual_seed(0)
    x, r = torch.randn(3, 5, 4), torch.randn(3, 2, 4)
    xm, rm = torch.ones(3, 5), torch.tensor([[1, 1], [1, 0], [0, 0]])
    f = bertscore(x, xm, r, rm)[2]
    for i in range(2):  # row by row equals the batch
        assert f[i].item() == pytest.approx(
            bertscore(x[i : i + 1], xm[i : i + 1], r[i : i + 1], rm[i : i + 1])[2].item()
        )
    assert f[2].item() == 0.0


@pytest.fixture
def data():
    contexts = [
        "i love my dog and long walks in the park",
        "the movie had a great cast and a sad ending",
        "we baked cookies for the school sale",
    ] * 4
    true = [
        "my dog loves the park too",
        "the cast was great",
        "cookies for the sale sound great",
    ] * 4
    leaked = [f"{t} call me at 555 0134 or mail bob at example dot com" for t in true]
    out = []
    for i, (c, t, bad) in enumerate(zip(contexts, true, leaked)):
        out += [
            TrustExample(c, t, 1.0, "true_reply"),
            TrustExample(c, bad, 0.0, "pii"),
            TrustExample(c, true[(i + 1) % len(true)], 0.0, "off_context"),
        ]
    return out


def test_training_separates_and_weights_travel(encoder_dir, data):  # noqa: F811
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
    ev = TrustEvaluator(str(encoder_dir), max_length=32, response_length=24, lora=lora, seed=0)
    before = ev.auc(data)
    assert set(before) >= {
        "auc",
        "auc_pii",
        "auc_off_context",
        "mean_score_trusted",
        "mean_score_untrusted",
    }
    initial = ev.weights()
    assert "calibration" in initial and any("lora_" in k for k in initial)
    stats = ev.train(data, steps=30, batch_size=12, lr=1e-2, seed=0)
    assert stats["loss"] < stats["mean_loss"] or stats["loss"] < 0.5
    after = ev.auc(data)

    def gap(a):
        return a["mean_score_trusted"] - a["mean_score_untrusted"]

    assert (
        gap(after) > gap(before) + 0.01 and after["auc"] >= before["auc"]
    )  # trusted replies pulled apart
    fresh = TrustEvaluator(str(encoder_dir), max_length=32, response_length=24, lora=lora, seed=0)
    np.testing.assert_allclose(
        fresh.scores(["a dog"], ["the dog"]), ev_scores := fresh.scores(["a dog"], ["the dog"])
    )
    fresh.load(ev.weights())
    np.testing.assert_allclose(
        fresh.scores([d.context for d in data], [d.response for d in data]),
        ev.scores([d.context for d in data], [d.response for d in data]),
        rtol=1e-5,
    )
    assert not np.allclose(ev_scores, fresh.scores(["a dog"], ["the dog"]))


def test_bertscore_f1_stays_in_range_when_precision_and_recall_differ_in_sign():
    # context tokens match the response (R > 0), the response's second token points away from
    # every context token (P just below 0): P + R near 0, where 2PR / (P + R) blows up
    x = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    r = torch.tensor([[[1.0, 0.0], [-1.0, -0.02], [-1.0, 0.02]]])
    p, rec, f = bertscore(x, torch.ones(1, 2), r, torch.ones(1, 3))
    assert rec.item() > 0 > p.item() and f.item() == 0.0


def test_the_proximal_term_acts_in_the_evaluators_loop(encoder_dir, data):  # noqa: F811
    """FedProx: the same 6 steps from the same weights move the evaluator less at mu 100; mu 0
    trains exactly as without the term."""
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
    start = TrustEvaluator(
        str(encoder_dir), max_length=32, response_length=24, lora=lora, seed=0
    ).weights()
    after = {}
    for mu in (0.0, 100.0):
        ev = TrustEvaluator(str(encoder_dir), max_length=32, response_length=24, lora=lora, seed=0)
        ev.train(data, steps=6, batch_size=12, lr=1e-2, seed=0, proximal_mu=mu)
        after[mu] = ev.weights()
    plain = TrustEvaluator(str(encoder_dir), max_length=32, response_length=24, lora=lora, seed=0)
    plain.train(data, steps=6, batch_size=12, lr=1e-2, seed=0)

    def moved(mu):
        return sum(float(np.linalg.norm(after[mu][k] - start[k])) for k in start)

    assert all(np.array_equal(after[0.0][k], v) for k, v in plain.weights().items())
    assert 0 < moved(100.0) < 0.5 * moved(0.0)
