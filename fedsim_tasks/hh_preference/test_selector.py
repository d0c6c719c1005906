"""Selectors: symmetric in A and B, weights round-trip, they learn; the paper's causal A/B form
on a tiny Llama built here."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim_tasks.causal_lm import load_tokenizer
from fedsim_tasks.hh_preference.dataset import Example, both_orders, load_pairs
from fedsim_tasks.hh_preference.selector import (
    CausalABSelector,
    ScorerSelector,
    TfidfScorer,
    response_text,
)
from fedsim_tasks.hh_preference.test_dataset import ROOT
from fedsim_tasks.test_causal_lm import llama_dir, one_thread, save_tiny_llama  # noqa: F401 (fixtures)


def test_response_text_keeps_the_response_whole():
    prompt = "\n\nHuman: one two three four\n\nAssistant:"
    assert response_text(prompt, "reply", 0) == "reply"
    assert response_text(prompt, "reply", 2) == "three four [SEP] reply"


@pytest.mark.parametrize(
    "frozen,lora",
    [
        (True, None),
        (False, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}),
    ],
)
def test_scorer_is_symmetric_round_trips_and_fits(frozen, lora):
    examples = both_orders(load_pairs(ROOT)[:16])
    selector = ScorerSelector(max_length=64, frozen=frozen, lora=lora, seed=0)
    before = selector.loss(examples)
    assert before == pytest.approx(np.log(2))  # zero head: no preference yet
    selector.train(
        examples, steps=30 if frozen else 8, batch_size=8, lr=5e-2 if frozen else 1e-2, seed=0
    )
    p = selector.prob_b(examples)
    assert np.allclose(p[0::2], 1 - p[1::2], atol=1e-5)  # swapping A and B flips the choice
    assert selector.loss(examples) < before - 0.05
    weights = selector.weights()
    trainable = {"head.weight", "head.bias"} if frozen else None
    if trainable:
        assert set(weights) == trainable
    else:
        assert any("lora" in k for k in weights) and "head.weight" in weights
    fresh = ScorerSelector(max_length=64, frozen=frozen, lora=lora, seed=0)
    fresh.load(weights)
    assert np.allclose(fresh.prob_b(examples), p, atol=1e-5)


def test_tfidf_scorer_is_symmetric_reads_the_prompt_and_beats_chance_held_out():
    """The judge of another family: swapping A and B negates its margin, its score of a reply
    depends on the prompt it answers, and trained on 1,000 real pairs it is right on more than
    half of 500 others."""
    pairs = load_pairs(ROOT)
    judge = TfidfScorer(human_words=32)
    judge.train(both_orders(pairs[:1000]), 1000)
    held_out = both_orders(pairs[1000:1500])
    margins = judge.margins(held_out)
    assert np.allclose(margins[0::2], -margins[1::2]) and judge.accuracy(held_out) > 0.55
    prompts = [p.prompt for p in pairs[:50]]
    reply = [pairs[0].chosen] * 50
    assert (
        np.ptp(judge.scores(prompts, reply).detach().numpy()) > 0
    )  # the same reply scores differently per prompt


def test_tfidf_min_df_counts_distinct_texts_not_both_orders():
    """Both orders of a pair hold each response twice: a word of one response alone is no
    feature at min_df 2 (fit on each order, every word passed)."""
    pairs = [
        Example(0, "p", "alpha beta", "gamma beta", 0),
        Example(1, "q", "delta beta", "epsilon", 1),
    ]
    scorer = TfidfScorer(human_words=0, min_df=2)
    scorer.train(
        [*pairs, *(Example(e.pair_id, e.prompt, e.b, e.a, 1 - e.label) for e in pairs)], 100
    )
    assert set(scorer.vectorizer.vocabulary_) == {"beta"}


def test_the_proximal_term_acts_in_the_selectors_loop():
    """FedProx: the same 8 steps from the same head move it less at mu 100; mu 0 trains exactly
    as without the term."""
    examples = both_orders(load_pairs(ROOT)[:16])
    start = ScorerSelector(max_length=64, frozen=True, seed=0).weights()
    after = {}
    for mu in (None, 0.0, 100.0):
        selector = ScorerSelector(max_length=64, frozen=True, seed=0)
        selector.train(
            examples,
            steps=8,
            batch_size=8,
            lr=5e-2,
            seed=0,
            **({} if mu is None else {"proximal_mu": mu}),
        )
        after[mu] = selector.weights()

    def moved(mu):
        return sum(float(np.linalg.norm(after[mu][k] - start[k])) for k in start)

    assert all(np.array_equal(after[0.0][k], after[None][k]) for k in start)
    assert 0 < moved(100.0) < 0.5 * moved(None)


def test_causal_ab_selector_learns_a_planted_preference(llama_dir, tmp_path):  # noqa: F811
    tokenizer = load_tokenizer(llama_dir)
    tokenizer.save_pretrained(tmp_path)
    save_tiny_llama(tmp_path, tokenizer, max_positions=512)
    pairs = [(f"question {i}", "yes good answer", "no bad answer") for i in range(8)]
    examples = [
        e
        for i, (q, good, bad) in enumerate(pairs)
        for e in (Example(i, q, good, bad, 0), Example(i, q, bad, good, 1))
    ]
    selector = CausalABSelector(
        str(tmp_path),
        lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        seed=0,
    )
    assert all("lora" in k for k in selector.weights())
    selector.train(examples, steps=40, batch_size=8, lr=1e-2, seed=0)
    assert selector.accuracy(examples) == 1.0
