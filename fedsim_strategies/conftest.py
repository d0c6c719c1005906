"""What strategy tests share: messages built outside a Flower run, and a Grid that only lists nodes."""

import pytest


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    """Messages built outside a Flower run need a run id, as the SuperLink sets in a run."""
    from fedsim.flower.messages import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0, raising=False)


class NodeIds:
    """The part of a Grid a strategy's sampling reads: node ids 1..n."""

    def __init__(self, n: int):
        self.n = n

    def get_node_ids(self):
        return range(1, self.n + 1)
