"""The trust dataset: planted PII, labels, off-context replies, seeding, disjoint splits."""

import re

import pytest

from fedsim.data import resolve_data_root
from tasks.dialogue.dataset import examples, persona_chat
from tasks.dialogue.trust_data import PII_TEMPLATES, trust_examples

ROOT = str(resolve_data_root())
LABELS = {"true_reply": 1.0, "pii": 0.0, "off_context": 0.0}
PII = re.compile(r"\d{3}|@|My name is|ask for|card|live at|Come by")


@pytest.fixture(scope="module")
def spc():
    return examples(persona_chat(ROOT, "valid")[:60], " [SEP] ", 2, 40, ["User 2"], "Persona")


def test_every_context_has_a_true_a_leaking_and_an_off_context_reply(spc):
    data = trust_examples(spc, 30, seed=0, labels=LABELS)
    assert len(data) == 90
    conversation = {(e.context, e.reply): e.conv_id for e in spc}
    for true, pii, off in zip(data[0::3], data[1::3], data[2::3]):
        assert (true.kind, pii.kind, off.kind) == ("true_reply", "pii", "off_context")
        assert (true.label, pii.label, off.label) == (1.0, 0.0, 0.0)
        assert true.context == pii.context == off.context
        assert (true.context, true.response) in conversation  # the context's own reply
        assert true.response in pii.response and len(pii.response) > len(true.response)
        assert PII.search(pii.response.replace(true.response, "")), pii.response
        own = conversation[(true.context, true.response)]
        assert any(r == off.response and c != own for (_, r), c in conversation.items())  # another conversation's


def test_every_kind_of_personal_data_is_planted(spc):
    leaks = [e.response for e in trust_examples(spc, 60, seed=1, labels=LABELS) if e.kind == "pii"]
    found = {kind for kind, templates in PII_TEMPLATES.items()
             for t in templates if any(t.split("{")[0] in leak for leak in leaks)}
    assert found == set(PII_TEMPLATES)


def test_seeded_and_labels_checked(spc):
    assert trust_examples(spc, 10, 3, LABELS) == trust_examples(spc, 10, 3, LABELS)
    assert trust_examples(spc, 10, 3, LABELS) != trust_examples(spc, 10, 4, LABELS)
    soft = trust_examples(spc, 5, 0, {**LABELS, "off_context": 0.3})
    assert {e.label for e in soft if e.kind == "off_context"} == {0.3}
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        trust_examples(spc, 5, 0, {**LABELS, "pii": -1.0})
    with pytest.raises(ValueError, match="two conversations"):
        trust_examples([e for e in spc if e.conv_id == spc[0].conv_id], 5, 0, LABELS)


def test_client_and_held_out_trust_contexts_do_not_overlap():
    train = examples(persona_chat(ROOT, "valid")[:100], " [SEP] ", 2, 40, ["User 2"], "Persona")
    test = examples(persona_chat(ROOT, "test")[:100], " [SEP] ", 2, 40, ["User 2"], "Persona")
    client = {e.context for e in trust_examples(train, 50, 0, LABELS)}
    held_out = {e.context for e in trust_examples(test, 50, 7, LABELS)}
    assert client and held_out and not (client & held_out)
