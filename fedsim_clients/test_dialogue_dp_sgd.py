"""A dialogue client's DP-SGD epsilon counts every training it performed and sent: a server that
sends a round again, even while the client is still training it, gets no training for free; and
it holds with the record count the client's reply publishes (replace one record)."""

from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedsim.message_keys import NUM_EXAMPLES
from fedsim.runtime import client_state
from fedsim_clients import dialogue
from fedsim_clients import feddtre_messages as keys
from fedsim_clients.dialogue import DialogueClient
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, prepare_base
from fedsim_tasks.dp_sgd import DP_EPSILON, DP_EPSILON_PLD, DP_EPSILON_RDP, spent_epsilons
from fedsim_tasks.test_causal_lm import encoder_dir, one_thread  # noqa: F401 (fixtures: a tiny BERT, one thread)
from fedsim_tasks.test_dp_sgd import EXAMPLES, LORA, dp_sgd, replace_one_pld

STEPS, BATCH = 3, 2


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch, tmp_path):
    """Messages built outside a Flower run need a run id, as the SuperLink sets in a run; the
    node's client-state root is the test's own folder (node-local configuration, never the
    message's)."""
    monkeypatch.setenv("FEDSIM_STATE_DIR", str(tmp_path / "state"))
    from fedsim.flower.messages import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0, raising=False)


def _train_message(method: str = "fedavg") -> Message:
    return Message(
        RecordDict(
            {
                keys.CONFIG: ConfigRecord(
                    {
                        keys.LOCAL_STEPS: STEPS,
                        keys.BATCH_SIZE: BATCH,
                        keys.DATASET: "persona_chat",
                        keys.SERVER_ROUND: 1,
                        keys.DP_ACCOUNT: f"persona_chat-{method}",
                        client_state.RUN_KEY: "run",
                    }
                )
            }
        ),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )


def _client(encoder: Path, tmp_path: Path):
    """A dialogue client (partition 0) with a tiny generator and its DP-SGD settings; _sft reads
    no dataset, so none is loaded."""
    base = prepare_base(str(encoder), tmp_path / "base", seed=0)
    model, tokenizer = load_policy(base, LORA, seed=0), load_tokenizer(base)
    dp = dp_sgd(enabled=True, max_grad_norm=0.1, noise_multiplier=1.0)
    settings = {"dp_sgd": dp.as_dict(), "rounds": 1, "max_length": 32, "lr": 1e-2, "lr_final": 1e-2}
    client = DialogueClient.__new__(DialogueClient)
    client.partition_id = 0
    return (lambda msg: client._sft(msg, model, tokenizer, EXAMPLES, settings, seed=1)), dp


def _epsilon(sigma: float, trainings: int, delta: float) -> float:
    """The epsilon reported for ``trainings`` x STEPS steps at rate BATCH / records."""
    return spent_epsilons([(sigma, BATCH / len(EXAMPLES), trainings * STEPS)], delta).reported


def test_a_round_sent_again_while_training_is_counted_twice(encoder_dir, tmp_path, monkeypatch):  # noqa: F811
    """Attack: the server sends round 1 again while the client still trains its first copy
    (a timed-out round, a server replaying rounds). The client has then released two trainings
    on its records; the reply that ends last must count both. Each training read the account when
    it started and wrote it back when it ended, so the second one to end overwrote the first's
    steps: every reply and every later round reported one training of the two."""
    sft, dp = _client(encoder_dir, tmp_path)
    msg, replies, real = _train_message(), [], dialogue.sft_train

    def sent_again_meanwhile(*args, **kwargs):
        if not replies:  # the first copy has started; the second copy trains and replies
            replies.append(None)
            replies.append(sft(msg))
        return real(*args, **kwargs)

    monkeypatch.setattr(dialogue, "sft_train", sent_again_meanwhile)
    first = sft(msg)
    sigma = first["dp-noise-multiplier"]
    assert first[DP_EPSILON] == pytest.approx(
        _epsilon(sigma, 2, dp.delta)
    )  # it ended last: both trainings
    assert replies[-1][DP_EPSILON] == pytest.approx(
        _epsilon(sigma, 1, dp.delta)
    )  # it ended first: one then
    monkeypatch.setattr(dialogue, "sft_train", real)
    assert sft(msg)[DP_EPSILON] == pytest.approx(_epsilon(sigma, 3, dp.delta))


def test_every_method_trained_on_the_records_is_counted(encoder_dir, tmp_path):  # noqa: F811
    """Attack: the server sees every method's updates (fedavg's, then feddtre's, on the same
    client's records). One account per method reported each method's epsilon alone, as if the
    server had seen only that method's trainings. ``dp-epsilon`` is over every method's;
    ``dp-epsilon-method`` still gives the method's own."""
    sft, dp = _client(encoder_dir, tmp_path)
    sft(_train_message("fedavg"))
    second = sft(_train_message("feddtre"))
    sigma = second["dp-noise-multiplier"]
    assert second[DP_EPSILON] == pytest.approx(_epsilon(sigma, 2, dp.delta))
    assert second[keys.DP_EPSILON_METHOD] == pytest.approx(_epsilon(sigma, 1, dp.delta))
    both = spent_epsilons(
        [(sigma, BATCH / len(EXAMPLES), 2 * STEPS)], dp.delta
    )  # PLD beside RDP, every method's
    assert (second[DP_EPSILON_RDP], second[DP_EPSILON_PLD]) == pytest.approx((both.rdp, both.pld))
    assert second[DP_EPSILON] == min(second[DP_EPSILON_RDP], second[DP_EPSILON_PLD])


def test_the_reply_epsilon_holds_with_its_published_record_count(encoder_dir, tmp_path):  # noqa: F811
    """Attack: the reply publishes the client's record count (``num-examples``; results.json and
    the partitioning too), which tells a data set with one record more or less apart by itself.
    The add-or-remove epsilon (Opacus's RDP, 8.98 for these 6 steps at rate 1/2 and sigma 1) is
    below what replacing one record, which keeps the count, costs: dp-accounting's replace-one
    PLD of the same steps (11.70). Every epsilon in the reply must be at least that."""
    sft, dp = _client(encoder_dir, tmp_path)
    sft(_train_message("fedavg"))
    reply = sft(_train_message("feddtre"))
    sigma, records = reply["dp-noise-multiplier"], reply[NUM_EXAMPLES]
    published = replace_one_pld(sigma, BATCH / records, 2 * STEPS, dp.delta)
    assert published == pytest.approx(11.70, abs=0.01)
    assert published <= reply[DP_EPSILON] <= min(reply[DP_EPSILON_RDP], reply[DP_EPSILON_PLD])
    assert reply[keys.DP_EPSILON_METHOD] >= replace_one_pld(sigma, BATCH / records, STEPS, dp.delta)
