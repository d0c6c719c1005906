"""The pause between pulls follows what an empty pull costs, capped at the run's interval
(a fake clock: each pull takes the seconds the test says)."""

from fedsim.runtime.polling import PAUSE_PER_PULL, WAITED_SHARE, Poller


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pull_taking(clock: Clock, seconds: float, replies: list):
    def pull(ids: list[str]) -> list:
        clock.now += seconds
        return list(replies)

    return pull


def test_a_cheap_pull_is_repeated_soon_and_a_costly_one_at_most_at_the_ceiling():
    clock = Clock()
    cheap, costly = Poller(0.1, clock), Poller(0.1, clock)
    cheap.pull(pull_taking(clock, 0.0002, []), ["a"])
    costly.pull(pull_taking(clock, 0.02, []), ["a"])
    assert cheap.seconds() == PAUSE_PER_PULL * 0.0002  # 4 ms, not the 0.1 s ceiling
    assert costly.seconds() == 0.1  # 20 x 0.02 = 0.4, capped


def test_a_pull_that_brought_replies_does_not_set_the_pace():
    clock = Clock()
    poller = Poller(1.0, clock)
    poller.pull(pull_taking(clock, 0.001, []), ["a", "b"])
    assert poller.pull(pull_taking(clock, 0.3, ["reply"]), ["a", "b"]) == ["reply"]
    assert poller.seconds() == PAUSE_PER_PULL * 0.001  # reading replies is not what polling costs


def test_the_first_pull_sets_the_pace_until_an_empty_one_comes():
    clock = Clock()
    poller = Poller(1.0, clock)
    poller.pull(pull_taking(clock, 0.01, ["reply"]), ["a"])
    assert poller.seconds() == PAUSE_PER_PULL * 0.01
    poller.pull(pull_taking(clock, 0.002, []), ["b"])
    assert poller.seconds() == PAUSE_PER_PULL * 0.002


def test_a_zero_ceiling_never_waits():
    clock = Clock()
    poller = Poller(0.0, clock)
    poller.pull(pull_taking(clock, 0.01, []), ["a"])
    assert poller.seconds() == 0.0


def test_a_long_wait_polls_less_the_longer_it_lasts():
    clock = Clock()
    poller = Poller(0.1, clock)
    poller.pull(pull_taking(clock, 0.0001, []), ["a"])
    assert poller.seconds() == PAUSE_PER_PULL * 0.0001  # 2 ms at the start
    clock.now = 0.5
    assert poller.seconds() == WAITED_SHARE * 0.5  # half a second in: 25 ms
    clock.now = 600.0
    assert poller.seconds() == 0.1  # minutes of training: the ceiling, as before
