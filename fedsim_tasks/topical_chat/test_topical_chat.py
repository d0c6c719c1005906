"""Task tests on the real Topical-Chat files (../shared/data or $FEDSIM_DATA_ROOT)."""

import json

import numpy as np
import pytest

from fedsim.config.data import DataNotFoundError, resolve_data_root
from fedsim_tasks.topical_chat.dataset import (
    POOLS,
    SPLITS,
    Conversation,
    Turn,
    load_conversations,
    load_split,
    load_topics,
    local_preference,
    redrawn_rows,
)
from fedsim_tasks.topical_chat.router import EvidenceRouter, RouterVariant, router_for

ROOT = str(resolve_data_root())


def test_topic_space_is_the_516_wiki_sections():
    topics = load_topics(ROOT)
    assert len(topics) == 516 and len(set(topics.index.values())) == 516


def test_gold_is_the_speakers_entry_for_the_first_fs_label():
    root = resolve_data_root() / "topical_chat"
    raw = json.loads((root / "conversations" / "valid_freq.json").read_text())
    reading = json.loads((root / "reading_sets" / "valid_freq.json").read_text())
    topics = load_topics(ROOT)
    conv = load_split(ROOT, "valid_freq")[0]
    cid = conv.conversation_id
    for turn, raw_turn in zip(conv.turns, raw[cid]["content"]):
        fs = [s for s in raw_turn["knowledge_source"] if s in ("FS1", "FS2", "FS3")]
        entries = reading[cid][raw_turn["agent"]]
        if not fs:
            assert turn.gold == -1
            continue
        entry = entries[fs[0]]
        section = entry.get(
            "shortened_wiki_lead_section", entry.get("summarized_wiki_lead_section")
        )
        assert turn.gold == topics.index[section]
        assert turn.candidates[int(fs[0][2]) - 1] == turn.gold


def test_local_preference_histogram_and_uniform_fallback():
    conv = Conversation(
        "c",
        "x",
        (
            Turn("a", 3, (3, 4, 5)),
            Turn("b", 3, (3, 4, 5)),
            Turn("c", 4, (3, 4, 5)),
            Turn("d", -1, (3, 4, 5)),
            Turn("e", 5, (3, 4, 5)),
            Turn("f", 5, (3, 4, 5)),
            Turn("g", 5, (3, 4, 5)),
        ),
    )
    p = local_preference(conv, 8)  # first half = turns 0..2
    np.testing.assert_allclose(p[[3, 4]], [2 / 3, 1 / 3])
    assert p.sum() == pytest.approx(1.0) and p[5] == 0
    empty = Conversation("c", "x", (Turn("a", -1, (0, 1, 2)), Turn("b", 1, (0, 1, 2))))
    np.testing.assert_allclose(local_preference(empty, 4), 0.25)


def test_slice_and_missing_split_errors(tmp_path):
    assert len(load_conversations(ROOT, ("valid_freq", "test_rare"), 3)) == 6
    with pytest.raises(ValueError, match="unknown Topical-Chat split"):
        load_split(ROOT, "train")
    with pytest.raises(DataNotFoundError, match=str(tmp_path)):
        load_topics(str(tmp_path))


def test_router_prior_breaks_ties_and_metrics_are_bounded():
    router = router_for(ROOT)
    conv = load_split(ROOT, "test_freq")[0]
    n = router.num_topics
    p_local = local_preference(conv, n)
    turns = [t for t in conv.turns[conv.half :] if t.gold >= 0]
    # a prior that puts all mass on every turn's third candidate wins whenever lambda is huge
    prior = np.zeros(n)
    prior[[t.candidates[2] for t in turns]] = 1.0
    variants = [
        RouterVariant("tfidf", "", 0.0, 0.0),
        RouterVariant("forced", "p", 1.0, 100.0),
        RouterVariant("local", "", 0.0, 0.01),
    ]
    out = router.route(conv, p_local, {"p": prior}, variants)
    assert len(out["gold"]) == len(turns) > 0
    np.testing.assert_array_equal(out["pick/forced"], [t.candidates[2] for t in turns])
    for v in variants:
        assert np.all((out[f"support/{v.name}"] >= 0) & (out[f"support/{v.name}"] <= 1))
        assert np.all((out[f"err/{v.name}"] >= 0) & (out[f"err/{v.name}"] <= 1 + 1e-9))
        assert set(out[f"pick/{v.name}"]) <= {c for t in turns for c in t.candidates}


def test_router_ties_go_to_fs1_and_count_as_ambiguous():
    topics = load_topics(ROOT)
    router = EvidenceRouter(topics)
    # an empty query has cosine 0 with every candidate: a tie, broken towards FS1
    conv = Conversation("c", "x", (Turn("", -1, (7, 8, 9)), Turn("", 8, (7, 8, 9))))
    out = router.route(conv, np.zeros(len(topics)), {}, [RouterVariant("t", "", 0.0, 0.0)])
    assert out["pick/t"].tolist() == [7] and out["ambiguous"].tolist() == [True]
    assert out["support/t"].tolist() == [0.0]


def test_a_limited_split_is_the_first_conversations_of_the_whole():
    assert load_split(ROOT, "valid_rare", 3) == load_split(ROOT, "valid_rare")[:3]
    assert load_split(ROOT, "valid_rare", None) == load_split(ROOT, "valid_rare")


def _ids(convs) -> set[str]:
    return {c.conversation_id for c in convs}


def test_a_split_seed_redraws_valid_and_test_within_each_frequency():
    published = {s: load_split(ROOT, s) for s in SPLITS}
    drawn = {s: load_split(ROOT, s, None, 3) for s in SPLITS}
    for valid, test in POOLS.values():
        assert [len(drawn[s]) for s in (valid, test)] == [len(published[s]) for s in (valid, test)]
        assert not _ids(drawn[valid]) & _ids(drawn[test])
        assert _ids(drawn[valid]) | _ids(drawn[test]) == _ids(published[valid]) | _ids(
            published[test]
        )
        assert _ids(drawn[test]) & _ids(published[valid]) and _ids(drawn[test]) != _ids(
            published[test]
        )
        assert {c.split for c in drawn[valid]} == {valid} and {c.split for c in drawn[test]} == {
            test
        }
    assert len(_ids(c for convs in drawn.values() for c in convs)) == sum(
        len(v) for v in published.values()
    )


def test_a_split_seed_is_deterministic_and_none_is_the_published_split():
    assert load_split(ROOT, "test_rare", None, None) == load_split(ROOT, "test_rare")
    assert redrawn_rows([5, 7], 3, "rare") == redrawn_rows([5, 7], 3, "rare")
    assert redrawn_rows([5, 7], 3, "rare") != redrawn_rows([5, 7], 4, "rare")
    assert redrawn_rows([5, 7], 3, "rare") != redrawn_rows([5, 7], 3, "freq")
    assert _ids(load_split(ROOT, "test_freq", None, 3)) != _ids(
        load_split(ROOT, "test_freq", None, 4)
    )
    assert (
        load_conversations(ROOT, ("valid_rare", "test_freq"), 2, 3)
        == load_split(ROOT, "valid_rare", None, 3)[:2] + load_split(ROOT, "test_freq", None, 3)[:2]
    )
