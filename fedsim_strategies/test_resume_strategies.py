"""Resume covers FedBiscuit's and FedDTRE's strategies: a run killed mid-round, resumed from its
journal on nodes with new ids, ends with the selectors, groups, global weights and alphas of an
uninterrupted run (in-process grid, real wire format, client sampling drawn from ``random``).
Replies are pulled in no fixed order, so float32 sums may differ in the last bit between any
two runs: weights are compared to 1e-6, groups and sampled clients exactly."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from fedsim.message_keys import PARTITION_ID
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import WHOAMI, Journal
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.server_app import seed_server
from fedsim_strategies.selector_groups import SelectorGroups
from fedsim_strategies.test_selector_groups import _client as selector_client
from fedsim_strategies.test_trust_alpha import _client as trust_client
from fedsim_strategies.trust_alpha import TrustAlpha

KEY = b"k" * 32  # the journal's HMAC key (a run keeps it 0600 under its results folder)


class Killed(BaseException):
    """The server process dies (not an Exception: no reply, no clean-up)."""


def _nodes(handlers: list, ids: list[int], kill_at: tuple[str, int] | None = None) -> InProcessGrid:
    """Partition p at node ids[p]; the run dies when a message of ``kill_at`` (type, round) goes out."""

    def node(partition_id, handle):
        def answer(msg):
            if WHOAMI in msg.content.config_records:
                return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: partition_id})})
            config = msg.content.config_records.get("config", {})
            if kill_at == (msg.metadata.message_type, int(config.get("server-round", 0))):
                raise Killed()
            return handle(msg)

        return answer

    return InProcessGrid(
        {n: node(partition_id, h) for partition_id, (n, h) in enumerate(zip(ids, handlers))}
    )


def _run(make_strategy, handlers, ids, rounds, journal=None, kill_at=None):
    seed_server(0)  # Flower's node sampling, seeded as the ServerApp seeds it
    messenger = Messenger(_nodes(handlers, ids, kill_at), timeout=5, journal=journal)
    strategy = make_strategy()
    nodes = sorted(messenger.node_ids())
    result = strategy.start(
        messenger.grid("m", nodes=nodes),
        to_record({"w": np.zeros(1, np.float32)}),
        num_rounds=rounds,
        timeout=5,
        train_config=ConfigRecord({}),
    )
    return strategy, result


def _killed_then_resumed(tmp_path, make_strategy, handlers, rounds, kill_at):
    try:
        _run(
            make_strategy,
            handlers,
            [11, 12, 13, 14, 15, 16],
            rounds,
            Journal(tmp_path, False, KEY),
            kill_at,
        )
    except Killed:
        pass
    else:
        raise AssertionError("the run was not killed")
    return _run(
        make_strategy, handlers, [91, 92, 93, 94, 95, 96], rounds, Journal(tmp_path, True, KEY)
    )


def _selector_groups():
    return SelectorGroups(
        3,
        warmup_rounds=1,
        regroup_every=2,
        regroup_quorum=0.5,
        fraction_train=0.5,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
    )


def test_fedbiscuit_selectors_and_groups_survive_a_kill(tmp_path):
    handlers = [selector_client(t) for t in (0.0, 0.5, 1.0, 10.0, 19.0, 20.0)]
    _, whole = _run(_selector_groups, handlers, [11, 12, 13, 14, 15, 16], 8)
    _, resumed = _killed_then_resumed(tmp_path, _selector_groups, handlers, 8, ("train", 6))
    assert [float(from_record(s)["w"][0]) for s in resumed.selectors] == pytest.approx(
        [float(from_record(s)["w"][0]) for s in whole.selectors], rel=1e-6
    )
    exact = lambda groups: [{k: v for k, v in g.items() if k != "mean_loss"} for g in groups]  # noqa: E731
    assert (
        exact(resumed.groups) == exact(whole.groups) and len(whole.groups) >= 2
    )  # regroups before and after
    assert [g["mean_loss"] for g in resumed.groups] == pytest.approx(
        [g["mean_loss"] for g in whole.groups], rel=1e-6
    )
    assert resumed.train_metrics == whole.train_metrics  # which groups trained in each round


def _trust_alpha():
    return TrustAlpha(
        k0=0.7,
        k_growth=0.5,
        midpoint=0.01,
        alpha_min=0.1,
        alpha_max=1.0,
        fraction_train=0.5,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
    )


def test_feddtre_schedule_and_alphas_survive_a_kill(tmp_path):
    handlers = [
        trust_client(v, 0.1 * i, 0.3, 10, []) for i, v in enumerate((1.0, 2.0, 3.0, 4.0, 5.0, 6.0))
    ]
    whole_strategy, whole = _run(_trust_alpha, handlers, [11, 12, 13, 14, 15, 16], 5)
    strategy, resumed = _killed_then_resumed(tmp_path, _trust_alpha, handlers, 5, ("train", 4))
    assert from_record(resumed.arrays)["w"].tolist() == pytest.approx(
        from_record(whole.arrays)["w"].tolist(), rel=1e-6
    )

    def strip(alphas):
        return {r: sorted((x["node"], x["alpha"]) for x in rows) for r, rows in alphas.items()}

    assert strip(strategy.alphas) == strip(whole_strategy.alphas)  # the same clients each round


def test_he_one_trip_survives_a_kill(tmp_path):
    """Replayed HE train replies rebuild the server's public context and the carried aggregate;
    the clients keep their installed copies on disk (CKKS noise: compared to 1e-4)."""
    from flwr.serverapp.strategy import FedAvg

    from fedsim_strategies.he_fedavg import HEFedAvg
    from fedsim_strategies.test_he_fedavg import VectorClient

    sizes, rng = [10, 30, 60], np.random.default_rng(0)
    vectors = [rng.normal(size=500) for _ in sizes]
    clients = [
        VectorClient(tmp_path / "keys", tmp_path / "state", i, v, n, step=True)
        for i, (v, n) in enumerate(zip(vectors, sizes))
    ]

    def run(ids, journal, kill_at=None):
        messenger = Messenger(_nodes(clients, ids, kill_at), timeout=5, journal=journal)
        HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096).start(
            messenger.grid("he", nodes=sorted(messenger.node_ids())),
            to_record({}),
            num_rounds=3,
            train_config=ConfigRecord(),
        )

    try:
        run([11, 12, 13], Journal(tmp_path / "journal", False, KEY), kill_at=("train", 3))
    except Killed:
        pass
    run([91, 92, 93], Journal(tmp_path / "journal", True, KEY))
    step = sum(n * v for n, v in zip(sizes, vectors)) / sum(sizes)
    for client in clients:
        np.testing.assert_allclose(client.he.global_weights(3), 3 * step, atol=1e-4)
