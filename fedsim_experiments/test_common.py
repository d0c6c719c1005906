"""Over-selection under the virtual clock: a strategy sampling ``over_selection`` times its
clients keeps, at the clock's quota, exactly as many as it sampled without the clock."""

from types import SimpleNamespace

from flwr.serverapp.strategy import FedAvg
from hypothesis import given
from hypothesis import strategies as st

from fedsim.clock.schedule import VirtualClock
from fedsim_experiments.common import over_select, sampled


@given(
    clients=st.integers(1, 300),
    fraction=st.floats(0.01, 1.0),
    minimum=st.integers(1, 300),
    factor=st.sampled_from([1.0, 1.1, 1.3, 1.5, 2.0, 2.5, 3.0]),
)
def test_the_quota_of_an_over_selected_round_is_what_the_round_sampled_before(
    clients, fraction, minimum, factor
):
    strategy = FedAvg(fraction_train=fraction, min_train_nodes=min(minimum, clients))
    before = sampled(strategy, clients)
    over_select(strategy, SimpleNamespace(over_selection=factor), clients)
    after = sampled(strategy, clients)
    quota = VirtualClock.quota(SimpleNamespace(over_selection=factor), after)
    assert after <= clients  # Flower would wait forever for more clients than there are
    if before * factor <= clients:
        assert quota == before
    else:  # every client sampled: the factor cannot be met
        assert after == clients


def test_feddtre_evaluators_three_of_six_at_one_and_a_half_sample_five_and_keep_three():
    """The case that truncation got wrong: fraction 0.5 of 6 clients, factor 1.5 (4.5 clients)."""
    strategy = FedAvg(fraction_train=0.5, min_train_nodes=2)
    assert over_select(strategy, SimpleNamespace(over_selection=1.5), 6) == 5
    assert VirtualClock.quota(SimpleNamespace(over_selection=1.5), sampled(strategy, 6)) == 3


def test_without_a_clock_the_sampled_count_is_unchanged():
    strategy = FedAvg(fraction_train=0.35, min_train_nodes=2)
    before = sampled(strategy, 10)
    over_select(strategy, None, 10)
    assert sampled(strategy, 10) == before
