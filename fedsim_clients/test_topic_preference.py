"""The FedTP client hosts the conversations of the task's split draw (``task.split_seed``), and
what it reports of them still matches what the server expects of each row."""

from fedsim.config.data import resolve_data_root
from fedsim_clients.fedtp_messages import INFO_ROWS, INFO_SPLITS
from fedsim_clients.topic_preference import TopicPreferenceClient
from fedsim_tasks.topical_chat.dataset import SPLITS, load_conversations, row_splits

ROOT = str(resolve_data_root())


def test_a_client_hosts_its_rows_of_the_redrawn_splits():
    task = {"splits": list(SPLITS), "max_per_split": 4, "split_seed": 7}
    clients = [TopicPreferenceClient(task, ROOT, pid, 4) for pid in range(4)]
    hosted = {row: c for client in clients for row, c in zip(client.rows, client.conversations)}
    assert [hosted[row] for row in sorted(hosted)] == list(load_conversations(ROOT, SPLITS, 4, 7))
    assert list(load_conversations(ROOT, SPLITS, 4, 7)) != list(load_conversations(ROOT, SPLITS, 4))
    reported = {
        row: split
        for client in clients
        for row, split in zip(client.discover()[INFO_ROWS], client.discover()[INFO_SPLITS])
    }
    assert [reported[row] for row in sorted(reported)] == row_splits(ROOT, SPLITS, 4)
