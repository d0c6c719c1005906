"""Dialogue examples of both datasets, their clients and held-out halves, on the real data."""

import copy

import pytest

from fedsim.config.data import DataNotFoundError, resolve_data_root
from fedsim_tasks.dialogue.dataset import cmu_dog, examples, load_tasks, persona_chat, topical_chat

ROOT = str(resolve_data_root())
SEP = " [SEP] "
GROUPED = {
    "_target_": "flwr_datasets.partitioner.GroupedNaturalIdPartitioner",
    "partition_by": "group",
    "sort_unique_ids": True,
}
TASK = {
    "num_clients": 10,
    "split_seed": 0,
    "valid_share": 0.1,
    "context_turns": 2,
    "grounding_words": 40,
    "max_conversations": None,
    "datasets": {
        "persona_chat": {
            "loader": "fedsim_tasks.dialogue.dataset.persona_chat",
            "train_split": "valid",
            "eval_split": "test",
            "reply_speakers": ["User 2"],
            "grounding_role": "Persona",
            "partitioner": {**GROUPED, "group_size": 100},
        },
        "cmu_dog": {
            "loader": "fedsim_tasks.dialogue.dataset.cmu_dog",
            "train_split": "train",
            "eval_split": "test",
            "reply_speakers": None,
            "grounding_role": "Document",
            "partitioner": {**GROUPED, "group_size": 3},
        },
    },
}


def test_persona_chat_examples_answer_as_user_2_with_its_persona():
    conv = persona_chat(ROOT, "valid")[0]
    ex = examples([conv], SEP, 2, 40, ["User 2"], "Persona")
    replies = [t for t in conv.turns[1:] if t.speaker == "User 2"]
    assert [e.reply for e in ex] == [t.text for t in replies]
    assert (
        ex[0].prompt == f"Persona: {conv.group} [SEP] Human: {conv.turns[0].text} [SEP] Assistant:"
    )
    # two turns of context: the Assistant's previous reply and the Human's turn, persona first
    assert ex[1].prompt.endswith(
        f"Assistant: {conv.turns[1].text} [SEP] Human: {conv.turns[2].text} [SEP] Assistant:"
    )
    assert ex[1].context == f"{conv.group} {conv.turns[1].text} {conv.turns[2].text}"
    assert len(persona_chat(ROOT, "valid")) == 1000 and len(persona_chat(ROOT, "test")) == 968


def test_cmu_dog_examples_carry_the_document_section_and_join_turns():
    conversations = cmu_dog(ROOT, "train")
    assert len(conversations) == 3373 and len({c.group for c in conversations}) == 30
    for conv in conversations[:50]:
        assert all(
            a.speaker != b.speaker for a, b in zip(conv.turns, conv.turns[1:])
        )  # one speaker's run joined
    conv = conversations[0]
    ex = examples([conv], SEP, 2, 40, None, "Document")
    assert len(ex) == len(conv.turns) - 1  # every turn after the first, both users
    section = " ".join(conv.turns[1].grounding.split()[:40])
    assert (
        ex[0].prompt.startswith(f"Document: {section} [SEP] Human: ")
        and ex[0].reply == conv.turns[1].text
    )
    assert (
        conv.group.lower() in " ".join(t.grounding for t in conv.turns).lower()
        or conv.turns[0].grounding
    )


def test_topical_chat_examples_have_no_grounding():
    ex = examples(topical_chat(ROOT, "valid_rare")[:3], SEP, 2, 0)
    assert ex and all(e.prompt.startswith(("Human:", "Assistant:")) for e in ex)


def test_clients_hold_whole_groups_and_held_out_halves_are_disjoint():
    tasks = load_tasks(TASK, ROOT)
    for name, d in tasks.items():
        clients = [d.client(p) for p in range(10)]
        ids = [{c.conv_id for c in cl.train + cl.valid} for cl in clients]
        assert (
            sum(map(len, ids)) == len(set().union(*ids)) == len(d.train)
        )  # a partition of the split
        groups = [{c.group for c in cl.train + cl.valid} for cl in clients]
        assert all(
            not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :]
        )  # whole groups per client
        for cl in clients:
            assert cl.valid and not ({c.conv_id for c in cl.train} & {c.conv_id for c in cl.valid})
        assert not ({c.conv_id for c in d.trust_heldout} & {c.conv_id for c in d.test})
        assert abs(len(d.trust_heldout) - len(d.test)) <= 1
        assert [c.conv_id for c in tasks[name].client(3).train] == [
            c.conv_id for c in clients[3].train
        ]  # seeded


def test_a_partitioner_that_does_not_give_num_clients_is_refused():
    task = copy.deepcopy(TASK)
    task["num_clients"] = 7
    with pytest.raises(ValueError, match="gives 10 clients but task.num_clients is 7"):
        load_tasks(task, ROOT)


def test_a_missing_split_names_its_source(tmp_path):
    with pytest.raises(DataNotFoundError, match="CMU_DoG"):
        cmu_dog(str(tmp_path), "train")
    with pytest.raises(DataNotFoundError, match="Synthetic-Persona-Chat"):
        persona_chat(str(tmp_path), "valid")


@pytest.mark.parametrize(
    "spec, why",
    [
        ({"clients": [10], "share": 0.5}, "partition ids"),
        ({"clients": [1, 1], "share": 0.5}, "distinct"),
        ({"clients": [1], "share": 2.0}, "share"),
    ],
)
def test_a_contamination_outside_the_clients_or_share_is_refused(spec, why):
    with pytest.raises(ValueError, match=why):
        load_tasks({**TASK, "contamination": spec}, ROOT)
