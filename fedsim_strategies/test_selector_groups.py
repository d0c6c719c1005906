"""FedBiscuit's grouping, eq. 6 and majority vote: balanced sizes, cheapest moves, non-reporters;
then SelectorGroups' regroup and eq. 6 round through Flower messages."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim_strategies.selector_groups import (
    GroupsResult,
    SelectorGroups,
    balanced_assignment,
    majority_vote,
    mix_selector,
)

NAN = np.nan


def balanced_sizes(m, u):
    q, r = divmod(m, u)
    return sorted([q + 1] * r + [q] * (u - r))


@pytest.mark.parametrize("u", [1, 3, 5])
def test_sizes_are_balanced(u):
    rng = np.random.default_rng(u)
    for m in range(1, 31):
        for _ in range(5):
            losses = rng.random((m, u))
            losses[rng.random(m) < 0.2] = NAN  # never-grouped non-reporters fill in
            out = balanced_assignment(losses)
            assert out.shape == (m,) and out.dtype == np.int64
            assert sorted(np.bincount(out, minlength=u)) == balanced_sizes(m, u)


def test_best_selector_kept_when_capacity_allows():
    rng = np.random.default_rng(0)
    for m in range(1, 20):
        best = rng.permutation(np.arange(m) % 3)
        losses = rng.random((m, 3))
        losses[np.arange(m), best] = -1.0
        np.testing.assert_array_equal(balanced_assignment(losses), best)


def test_cheapest_clients_move_and_never_into_a_closed_cluster():
    # M=6, U=3: shares 2 each. Clients 0-3 prefer selector 0, clients 4-5 selector 1.
    losses = np.array(
        [
            [0.1, 0.2, 0.9],  # regret to 1: 0.1
            [0.1, 0.8, 0.4],  # regret to 2: 0.3
            [0.1, 0.15, 0.9],  # regret to 1: 0.05
            [0.1, 0.9, 0.9],  # regret to 1: 0.8
            [0.5, 0.1, 0.2],  # after cluster 0 closes, regret to 2: 0.1
            [0.5, 0.1, 0.9],  # regret to 2: 0.8
        ]
    )
    # Cluster 0 (4) keeps clients 1, 3; clients 2 and 0 move to 1, which then holds 0, 2, 4, 5
    # and sends its two cheapest, 4 (0.1) and 0 (0.9 - 0.2 = 0.7 < 0.75), on to 2, not back to 0.
    np.testing.assert_array_equal(balanced_assignment(losses), [2, 0, 1, 0, 2, 1])


def test_largest_cluster_keeps_the_extra_slot():
    # M=5, U=2: shares 3 and 2. All prefer 0, so 0 is capped first and keeps 3: the costliest moves.
    losses = np.array([[0.1, 0.5], [0.1, 0.2], [0.1, 0.9], [0.1, 0.3], [0.1, 0.6]])
    np.testing.assert_array_equal(balanced_assignment(losses), [0, 1, 0, 1, 0])


def test_ties_go_to_lowest_index():
    # all equal: everyone starts at 0; 0 keeps 2 and sends clients 0-2 to 1 (lower than 2),
    # which keeps 2 and sends client 0 on to 2
    np.testing.assert_array_equal(balanced_assignment(np.zeros((5, 3))), [2, 1, 1, 0, 0])


def test_non_reporters_keep_their_previous_selector():
    losses = np.array(
        [
            [NAN] * 3,
            [0.1, NAN, 0.3],
            [0.1, 0.5, 0.9],
            [0.9, 0.1, 0.5],
            [0.2, 0.9, 0.1],
            [0.5, 0.5, 0.1],
        ]
    )
    out = balanced_assignment(losses, np.array([2, 1, 0, 0, 0, 0]))
    np.testing.assert_array_equal(out, [2, 1, 0, 1, 0, 2])  # previous of reporters is ignored


def test_never_grouped_non_reporters_join_the_smallest_cluster():
    # M=5, U=3 (shares 2, 2, 1). Reporters fill 0 with two and 1 with one; the first newcomer
    # joins the empty 2, the second the tie between 1 and 2 at size 1: the lower index, 1.
    losses = np.array([[0.1, 0.5, 0.5], [0.1, 0.5, 0.5], [0.5, 0.1, 0.5], [NAN] * 3, [NAN] * 3])
    out = balanced_assignment(losses, np.array([-1, -1, -1, -1, -1]))
    np.testing.assert_array_equal(out, [0, 0, 1, 2, 1])
    np.testing.assert_array_equal(balanced_assignment(losses), out)


def test_over_full_previous_group_is_kept_and_the_rest_balanced():
    # M=6, U=3 (shares 2): four non-reporters stay in 0. Both reporters leave 0 for their
    # next-best, 1; the two clients left then share 1 and 2, one each (the cheaper move goes to 2).
    losses = np.vstack([np.full((4, 3), NAN), [[0.1, 0.2, 0.3], [0.1, 0.2, 0.9]]])
    out = balanced_assignment(losses, np.array([0, 0, 0, 0, -1, 2]))
    np.testing.assert_array_equal(out, [0, 0, 0, 0, 2, 1])


def test_random_non_reporters_never_crowd_a_movable_client():
    # With kept groups anywhere, perfect balance may be impossible; what holds: kept clients stay,
    # and a cluster with a client the server could move is at most one larger than any other.
    rng = np.random.default_rng(1)
    for _ in range(300):
        m, u = int(rng.integers(1, 25)), int(rng.choice([1, 3, 5]))
        losses = rng.random((m, u))
        silent = rng.random(m) < 0.4
        losses[silent] = NAN
        previous = np.where(rng.random(m) < 0.5, rng.integers(0, u, m), -1)
        out = balanced_assignment(losses, previous)
        kept = silent & (previous >= 0)
        np.testing.assert_array_equal(out[kept], previous[kept])
        sizes = np.bincount(out, minlength=u)
        assert (sizes[out[~kept]] <= sizes.min() + 1).all()


def test_no_single_balanced_move_lowers_the_loss():
    # Greedy is no global optimum (a swap of two clients can help), but moving one client from a
    # q+1 cluster to a q cluster never does: each placement was the best selector still open, and
    # a q cluster closes before a later move only when no move follows.
    rng = np.random.default_rng(2)
    for _ in range(500):
        m = int(rng.integers(2, 8))
        losses = rng.random((m, 3))
        out = balanced_assignment(losses)
        sizes = np.bincount(out, minlength=3)
        for i in range(m):
            for v in range(3):
                if sizes[v] < sizes[out[i]]:  # the only moves that keep sizes within 1
                    assert losses[i, v] >= losses[i, out[i]]


@pytest.mark.parametrize(
    ("losses", "previous"),
    [
        (np.zeros(3), None),
        (np.zeros((0, 3)), None),
        (np.zeros((3, 0)), None),
        (np.array([[0.1, np.inf]]), None),
        (np.zeros((3, 2)), np.array([0, 1])),
        (np.zeros((3, 2)), np.array([0, 1, 2])),
        (np.zeros((3, 2)), np.array([0, -2, 1])),
        (np.zeros((3, 2)), np.array([0.0, 1.0, 1.0])),
    ],
)
def test_assignment_rejects_bad_input(losses, previous):
    with pytest.raises(ValueError):
        balanced_assignment(losses, previous)


def test_mix_selector_is_eq6():
    current = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([[0.5]], np.float32)}
    updates = [
        ({"w": np.array([3.0, 0.0]), "b": np.array([[1.5]])}, 0.2),
        ({"w": np.array([-1.0, 4.0]), "b": np.array([[0.5]])}, 0.3),
    ]
    out = mix_selector(current, updates)
    # w: 0.5 * [1, 2] + 0.2 * [3, 0] + 0.3 * [-1, 4] = [0.8, 2.2]; b: 0.25 + 0.3 + 0.15 = 0.7
    np.testing.assert_allclose(out["w"], [0.8, 2.2], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [[0.7]], rtol=1e-6)
    assert out["w"].dtype == np.float32 and out["b"].dtype == np.float32
    np.testing.assert_array_equal(current["w"], [1.0, 2.0])  # not mutated
    np.testing.assert_array_equal(mix_selector(current, [])["w"], current["w"])


@pytest.mark.parametrize(
    "updates",
    [
        [({"w": np.ones(2)}, 0.6), ({"w": np.ones(2)}, 0.5)],
        [({"w": np.ones(2)}, -0.1)],
        [({"v": np.ones(2)}, 0.1)],
        [({"w": np.ones(3)}, 0.1)],
    ],
)
def test_mix_selector_rejects_bad_updates(updates):
    with pytest.raises(ValueError):
        mix_selector({"w": np.zeros(2, np.float32)}, updates)


def test_majority_vote():
    votes = np.array([[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]])
    np.testing.assert_array_equal(majority_vote(votes), [1, 1, 1, 0])
    np.testing.assert_array_equal(majority_vote(np.array([[0, 1]])), [0, 1])


@pytest.mark.parametrize(
    "votes", [np.zeros((2, 3), int), np.zeros((0, 3), int), np.array([[0, 2, 1]]), np.zeros(3)]
)
def test_majority_vote_rejects_bad_votes(votes):
    with pytest.raises(ValueError):
        majority_vote(votes)


# --- SelectorGroups through Flower messages (in-process grid, real wire format) -------------


def _client(target: float, crash_on_report: bool = False):
    """A client whose training returns its target and whose loss on selector u is the squared
    distance of the selector's value to the target."""

    def handle(msg):
        if msg.metadata.message_type == "train":
            return RecordDict(
                {
                    "arrays": to_record({"w": np.array([target], np.float32)}),
                    "metrics": MetricRecord({"num-examples": 1}),
                }
            )
        if crash_on_report:
            raise RuntimeError("client crashed while reporting losses")
        losses = {
            f"loss-{name.split('-')[1]}": float((from_record(r)["w"][0] - target) ** 2)
            for name, r in msg.content.array_records.items()
        }
        return RecordDict({"metrics": MetricRecord({**losses, "num-examples": 1})})

    return handle


def _groups_strategy():
    return SelectorGroups(
        3,
        warmup_rounds=1,
        regroup_every=1,
        regroup_quorum=0.5,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
    )


def test_regroup_then_eq6_through_messages():
    grid = Messenger(
        InProcessGrid({1: _client(0.0), 2: _client(0.5), 3: _client(10.0), 4: _client(19.0)}),
        timeout=5,
    ).grid("t")
    strategy = _groups_strategy()
    result = GroupsResult([to_record({"w": np.array([v], np.float32)}) for v in (0.0, 10.0, 20.0)])
    group = strategy._regroup(4, result.selectors, ConfigRecord(), grid)
    assert group["groups"] == {1: 0, 2: 0, 3: 1, 4: 2} and group["sizes"] == [2, 1, 1]
    strategy._group_round(4, result, ConfigRecord(), grid)
    # eq. 6 with p_m = 1/4 (one example each of four): (1 - sum p) phi + sum p phi_m
    assert [float(from_record(s)["w"][0]) for s in result.selectors] == pytest.approx(
        [0.125, 10.0, 19.75]
    )


def test_regroup_rows_follow_the_partitions_not_the_node_ids():
    """Flower draws new node ids for every run (a simulation others than a deployment): the
    regroup's rows, so its tie-breaks (all four clients tie here) and its loss sums, follow the
    Messenger's partition order. Rows sorted by node id gave one seed's run other groups in a
    deployment than in the simulation."""
    handlers = {9: _client(5.0), 3: _client(5.0), 7: _client(5.0), 1: _client(5.0)}
    messenger = Messenger(InProcessGrid(handlers), timeout=5)
    messenger.partitions = {9: 0, 3: 1, 7: 2, 1: 3}  # as whoami told them
    selectors = [to_record({"w": np.array([0.0], np.float32)}) for _ in range(3)]
    group = _groups_strategy()._regroup(4, selectors, ConfigRecord(), messenger.grid("t"))
    assert group["groups"] == dict(
        zip([9, 3, 7, 1], balanced_assignment(np.zeros((4, 3))).tolist())
    )


def test_a_crashed_report_keeps_the_clients_group_and_is_counted():
    handlers = {1: _client(0.0), 2: _client(0.5), 3: _client(10.0), 4: _client(19.0)}
    messenger = Messenger(InProcessGrid(handlers), timeout=5)
    strategy = _groups_strategy()
    selectors = [to_record({"w": np.array([v], np.float32)}) for v in (0.0, 10.0, 20.0)]
    strategy._regroup(4, selectors, ConfigRecord(), messenger.grid("t"))
    handlers[4] = _client(
        0.0, crash_on_report=True
    )  # would now prefer selector 0, but cannot say so
    group = strategy._regroup(5, selectors, ConfigRecord(), messenger.grid("t"))
    assert group["groups"][4] == 2 and group["kept"] == 1 and group["reported"] == 3
    assert messenger.faults["t/regroup"][5]["failed"] == 1


def _weighted_client(target: float, examples: int):
    def handle(msg):
        metrics = {"num-examples": examples, "unit-weight": 1.0}
        if msg.metadata.message_type == "train":
            return RecordDict(
                {
                    "arrays": to_record({"w": np.array([target], np.float32)}),
                    "metrics": MetricRecord(metrics),
                }
            )
        losses = {
            f"loss-{name.split('-')[1]}": float((from_record(r)["w"][0] - target) ** 2)
            for name, r in msg.content.array_records.items()
        }
        return RecordDict({"metrics": MetricRecord({**losses, **metrics})})

    return handle


@pytest.mark.parametrize(
    "key, expected", [("num-examples", 0.75 * 4.0), ("unit-weight", 0.5 * 4.0)]
)
def test_p_m_follows_the_weighting_key_data_share_or_uniform(key, expected):
    # node 1 holds 3 of 4 examples: data-share p_m = 3/4 for it, uniform p_m = 1/2
    grid = Messenger(
        InProcessGrid({1: _weighted_client(4.0, 3), 2: _weighted_client(0.0, 1)}), timeout=5
    ).grid("t")
    strategy = SelectorGroups(
        1,
        warmup_rounds=1,
        regroup_every=1,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
        weighted_by_key=key,
    )
    result = strategy.start(
        grid, to_record({"w": np.array([0.0], np.float32)}), num_rounds=2, timeout=5
    )
    assert float(from_record(result.warmup[0])["w"][0]) == pytest.approx(
        expected
    )  # FedAvg warm-up, same weights
    assert float(from_record(result.selectors[0])["w"][0]) == pytest.approx(
        expected
    )  # eq. 6 after the regroup


def test_fixed_groups_skip_warmup_and_regroups_and_train_only_their_group():
    handlers = {n: _weighted_client(t, 1) for n, t in ((1, 1.0), (2, 2.0), (3, 3.0))}
    messenger = Messenger(InProcessGrid(handlers), timeout=5)
    strategy = SelectorGroups(
        3,
        0,
        0,
        fixed_groups={1: 0, 2: 1, 3: 2},
        fixed_weights={1: 1.0, 2: 1.0, 3: 1.0},
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
    )
    result = strategy.start(
        messenger.grid("t"), to_record({"w": np.array([0.0], np.float32)}), num_rounds=2, timeout=5
    )
    assert result.groups == [] and result.warmup == [] and "t/regroup" not in messenger.faults
    # two rounds of eq. 6 with p_m = 1/3 toward each client's own target
    assert [float(from_record(s)["w"][0]) for s in result.selectors] == pytest.approx(
        [t * (1 - (2 / 3) ** 2) for t in (1.0, 2.0, 3.0)]
    )


def test_fixed_groups_need_weights_for_the_same_nodes():
    with pytest.raises(ValueError, match="fixed_weights"):
        SelectorGroups(3, 0, 0, fixed_groups={1: 0}, fixed_weights={2: 1.0})
    with pytest.raises(ValueError, match="fixed_weights"):
        SelectorGroups(3, 0, 0, fixed_groups={1: 3}, fixed_weights={1: 1.0})
