"""The trust dataset: planted PII, labels, off-context replies, seeding, disjoint splits; the
same planting contaminating a client's training replies, and the PII wording found in replies."""

import re

import pytest

from fedsim.config.data import resolve_data_root
from fedsim_tasks.dialogue.dataset import examples, persona_chat
from fedsim_tasks.dialogue.trust_data import PII_TEMPLATES, contaminate, leaks_pii, trust_examples

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
        assert any(
            r == off.response and c != own for (_, r), c in conversation.items()
        )  # another conversation's


def test_every_kind_of_personal_data_is_planted(spc):
    leaks = [e.response for e in trust_examples(spc, 60, seed=1, labels=LABELS) if e.kind == "pii"]
    found = {
        kind
        for kind, templates in PII_TEMPLATES.items()
        for t in templates
        if any(t.split("{")[0] in leak for leak in leaks)
    }
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


def test_contamination_plants_pii_in_a_seeded_share_of_the_replies(spc):
    dirty = contaminate(spc, 0.5, seed=3)
    changed = [(a, b) for a, b in zip(spc, dirty) if a != b]
    assert len(dirty) == len(spc) and len(changed) == round(0.5 * len(spc))
    for clean, leaked in changed:
        assert (clean.prompt, clean.context, clean.conv_id) == (
            leaked.prompt,
            leaked.context,
            leaked.conv_id,
        )
        assert clean.reply in leaked.reply and leaks_pii(leaked.reply), leaked.reply
    assert dirty == contaminate(spc, 0.5, seed=3) != contaminate(spc, 0.5, seed=4)
    assert contaminate(spc, 0.0, 3) == spc and all(
        a != b for a, b in zip(spc, contaminate(spc, 1.0, 3))
    )
    with pytest.raises(ValueError, match="share"):
        contaminate(spc, 1.5, 3)


def test_pii_wording_is_found_in_generated_replies_but_rarely_in_true_ones(spc):
    assert leaks_pii(
        "ok . my email is john @ example . com"
    )  # lowercase, as the MiniLM decoder writes
    assert leaks_pii("Call me at 555-0100.") and not leaks_pii("i like to call my mom")
    assert sum(map(leaks_pii, [e.reply for e in spc])) / len(spc) < 0.05
