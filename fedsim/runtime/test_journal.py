"""Checkpoint by journal: a resumed Messenger replays what completed, sends nothing for it, maps
node ids by partition and goes on live; a different exchange order is refused."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedsim.message_keys import PARTITION_ID
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import WHOAMI, Journal, JournalTampered, ResumeMismatch
from fedsim.runtime.messaging import Messenger, Policy

KEY = b"k" * 32


def _grid(node_ids: list[int], calls: list) -> InProcessGrid:
    """Node ``node_ids[p]`` is partition p; it replies p * round and counts every call."""

    def handler(partition_id):
        def handle(msg):
            if WHOAMI in msg.content.config_records:
                return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: partition_id})})
            rnd = int(msg.content["config"]["round"])
            calls.append((partition_id, rnd))
            return RecordDict(
                {
                    "arrays": ArrayRecord([np.full(3, partition_id * rnd, dtype=np.float32)]),
                    "metrics": MetricRecord({"loss": float(partition_id + rnd)}),
                }
            )

        return handle

    return InProcessGrid(
        {node: handler(partition_id) for partition_id, node in enumerate(node_ids)}
    )


def _rounds(messenger: Messenger, rounds: range) -> list[dict]:
    """A protocol in the first run's node ids: each round asks every node, in partition order."""
    nodes = sorted(messenger.node_ids())
    out = []
    for rnd in rounds:
        replies = messenger.exchange(
            "fit/train",
            [
                Message(
                    RecordDict({"config": ConfigRecord({"round": rnd})}),
                    dst_node_id=n,
                    message_type=MessageType.TRAIN,
                )
                for n in nodes
            ],
            server_round=rnd,
        )
        out.append(
            {m.metadata.src_node_id: m.content["arrays"]["0"].numpy().tolist() for m in replies}
        )
    return out


def test_resume_replays_then_goes_on_live_with_new_node_ids(tmp_path):
    calls = []
    first = Messenger(
        _grid([11, 12, 13], calls), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)
    )
    done = _rounds(first, range(1, 3))  # killed after round 2
    assert len(calls) == 6
    calls.clear()
    resumed = Messenger(
        _grid([71, 72, 73], calls), timeout=5, journal=Journal(tmp_path, resume=True, key=KEY)
    )
    assert resumed.node_ids() == [11, 12, 13]  # the protocol keeps the first run's ids
    again = _rounds(resumed, range(1, 5))
    assert again[:2] == done  # replayed, nothing sent for them
    assert sorted(calls) == [(p, r) for p in range(3) for r in (3, 4)]
    assert again[3] == {11: [0.0] * 3, 12: [4.0] * 3, 13: [8.0] * 3}  # answered by the new nodes
    assert [resumed.faults["fit/train"][r] for r in (1, 2)] == [
        first.faults["fit/train"][r] for r in (1, 2)
    ]
    assert [resumed.traffic["fit/train"][r] for r in (1, 2)] == [
        first.traffic["fit/train"][r] for r in (1, 2)
    ]
    assert all(resumed.faults["fit/train"][r]["accepted"] == 3 for r in (3, 4))
    assert len(list(tmp_path.glob("*.exchange"))) == 4


def test_a_different_exchange_order_is_refused(tmp_path):
    _rounds(
        Messenger(_grid([1, 2], []), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)),
        range(1, 3),
    )
    resumed = Messenger(
        _grid([5, 6], []), timeout=5, journal=Journal(tmp_path, resume=True, key=KEY)
    )
    with pytest.raises(ResumeMismatch, match="fit/train round 1"):
        _rounds(resumed, range(2, 3))


def test_a_fresh_run_clears_the_journal(tmp_path):
    _rounds(
        Messenger(_grid([1, 2], []), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)),
        range(1, 3),
    )
    calls = []
    _rounds(
        Messenger(
            _grid([1, 2], calls), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)
        ),
        range(1, 2),
    )
    assert len(calls) == 2 and len(list(tmp_path.glob("*.exchange"))) == 1


def test_no_half_written_entry(tmp_path):
    journal = Journal(tmp_path, resume=False, key=KEY)
    _rounds(Messenger(_grid([1], []), timeout=5, journal=journal), range(1, 3))
    (tmp_path / "0000002.exchange.tmp").write_bytes(b"cut short")  # a kill during the write
    assert len(Journal(tmp_path, resume=True, key=KEY).recorded) == 2


def test_replayed_replies_pass_the_validator_again(tmp_path):
    _rounds(
        Messenger(_grid([1, 2], []), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)),
        range(1, 2),
    )
    resumed = Messenger(
        _grid([5, 6], []), timeout=5, journal=Journal(tmp_path, resume=True, key=KEY)
    )
    seen = []
    message = Message(
        RecordDict({"config": ConfigRecord({"round": 1})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    resumed.exchange(
        "fit/train", [message], Policy(validator=lambda c, node: seen.append(c) or None)
    )
    assert len(seen) == 2  # both journaled replies
    resumed = Messenger(
        _grid([5, 6], []), timeout=5, journal=Journal(tmp_path, resume=True, key=KEY)
    )
    with pytest.raises(ResumeMismatch, match="now rejected"):
        resumed.exchange("fit/train", [message], Policy(validator=lambda c, node: "changed rule"))


def _journaled_run(tmp_path) -> None:
    _rounds(
        Messenger(_grid([1, 2], []), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)),
        range(1, 3),
    )


def _resume(tmp_path, key=KEY) -> list[dict]:
    return _rounds(
        Messenger(_grid([5, 6], []), timeout=5, journal=Journal(tmp_path, resume=True, key=key)),
        range(1, 3),
    )


def test_an_altered_entry_is_refused_on_resume(tmp_path):
    """The attack: change what a client answered in round 1 (the resumed server would build on it)."""
    _journaled_run(tmp_path)
    path = tmp_path / "0000000.exchange"
    path.write_bytes(path.read_bytes().replace(b'\\"examples\\": 2', b'\\"examples\\": 9'))
    with pytest.raises(JournalTampered):
        _resume(tmp_path)


@pytest.mark.parametrize("where", [-1, -200])
def test_an_altered_reply_is_refused_on_resume(tmp_path, where):
    """The attack on the replies themselves (outside the sealed header): one byte of a journaled
    reply changed, its length kept."""
    _journaled_run(tmp_path)
    path = tmp_path / "0000000.exchange"
    data = bytearray(path.read_bytes())
    data[where] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(JournalTampered):
        _resume(tmp_path)


def test_a_planted_or_reordered_entry_is_refused_on_resume(tmp_path):
    _journaled_run(tmp_path)
    first, second = tmp_path / "0000000.exchange", tmp_path / "0000001.exchange"
    first.write_bytes(second.read_bytes())  # a genuine entry under another name
    with pytest.raises(JournalTampered):
        _resume(tmp_path)
    _journaled_run(tmp_path)
    import pickle

    first.write_bytes(pickle.dumps({"phase": "fit/train", "round": 1}))  # the former format
    with pytest.raises(JournalTampered):
        _resume(tmp_path)


def test_a_journal_under_another_key_is_refused(tmp_path):
    _journaled_run(tmp_path)
    with pytest.raises(JournalTampered):
        _resume(tmp_path, key=b"x" * 32)
    assert _resume(tmp_path)  # the run's own key replays it


def _three_rounds(tmp_path) -> None:
    _rounds(
        Messenger(_grid([1, 2], []), timeout=5, journal=Journal(tmp_path, resume=False, key=KEY)),
        range(1, 4),
    )


def _resume_three(tmp_path) -> list[dict]:
    return _rounds(
        Messenger(_grid([5, 6], []), timeout=5, journal=Journal(tmp_path, resume=True, key=KEY)),
        range(1, 4),
    )


@pytest.mark.parametrize(
    "cut", [[2], [1, 2], [1], [0]], ids=["last", "last-two", "middle", "first"]
)
def test_a_journal_with_entries_deleted_is_refused(tmp_path, cut):
    """The attack: delete journaled exchanges, so that the resumed run sends them again. A redone
    round draws the same noise (the run's secret) over replies that may differ (another sample, a
    client missing): two releases with one noise give a client's row exactly."""
    _three_rounds(tmp_path)
    for index in cut:
        (tmp_path / f"{index:07d}.exchange").unlink()
    with pytest.raises(JournalTampered):
        _resume_three(tmp_path)


def test_a_journal_with_its_head_removed_or_rolled_back_is_refused(tmp_path):
    _three_rounds(tmp_path)
    head = tmp_path / "head"
    old = head.read_bytes()
    _three_rounds(tmp_path)  # the same rounds again, in a new run: another head
    head.unlink()
    with pytest.raises(JournalTampered, match="head"):
        _resume_three(tmp_path)
    _journaled_run(tmp_path)  # two rounds: its head, then one of the first run's
    two = head.read_bytes()
    _three_rounds(tmp_path)
    head.write_bytes(two)  # an older head of this run (two entries) beside three entries
    with pytest.raises(JournalTampered):
        _resume_three(tmp_path)
    head.write_bytes(old)  # another run's head (same key here: the chain does not match)
    with pytest.raises(JournalTampered):
        _resume_three(tmp_path)


def test_a_kill_between_an_entry_and_its_head_resumes_with_the_entry(tmp_path, monkeypatch):
    """Each entry is written (then renamed) before the head that counts it: a kill between the
    two leaves one entry more than the head counts, chained to the head's last, and resumes."""
    journal = Journal(tmp_path, resume=False, key=KEY)
    messenger = Messenger(_grid([1, 2], []), timeout=5, journal=journal)
    _rounds(messenger, range(1, 3))
    monkeypatch.setattr(Journal, "_write_head", lambda self: None)  # killed before the head
    _rounds(messenger, range(3, 4))
    (tmp_path / "head.tmp").write_bytes(b"cut short")  # or during the head's write
    calls = []
    resumed = Journal(tmp_path, resume=True, key=KEY)
    assert resumed.resumed_from == 3
    _rounds(Messenger(_grid([5, 6], calls), timeout=5, journal=resumed), range(1, 5))
    assert sorted(calls) == [(0, 4), (1, 4)]  # round 3 replayed, round 4 live


def test_a_journal_killed_before_its_first_entry_resumes_from_the_start(tmp_path):
    Journal(tmp_path, resume=False, key=KEY)  # the head of no entry, then the kill
    calls = []
    resumed = Journal(tmp_path, resume=True, key=KEY)
    assert resumed.resumed_from == 0
    _rounds(Messenger(_grid([5, 6], calls), timeout=5, journal=resumed), range(1, 2))
    assert len(calls) == 2


def test_a_resume_under_a_changed_experiment_is_refused(tmp_path):
    """The attack: `flwr run . --run-config "resume=true overrides='protocol.alpha=0.9'"` (a
    ServerApp not started by `fedsim run`, whose resume check it skips) replays the journaled
    replies under other settings; a server-side setting changes no exchange, so nothing else
    would notice and the result would silently mix two experiments."""
    _rounds(
        Messenger(
            _grid([1, 2], []),
            timeout=5,
            journal=Journal(tmp_path, resume=False, key=KEY, experiment="a"),
        ),
        range(1, 3),
    )
    with pytest.raises(ResumeMismatch, match="experiment"):
        Journal(tmp_path, resume=True, key=KEY, experiment="b")
    assert len(Journal(tmp_path, resume=True, key=KEY, experiment="a").recorded) == 2
