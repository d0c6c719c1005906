"""Progress: plain lines with rate and time left in a log, one live bar per phase on a terminal."""

import io
import logging

import pytest
from flwr.app import Message, MessageType, RecordDict

from fedsim.progress import LINE, Bars, line
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger, PhaseFailed


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_line_carries_count_rate_and_time_left():
    text = line("discover", 120, 2156, 10.0)
    assert text == "[discover] 120/2156 clients done [00:10<02:49, 12.00clients/s]"
    assert LINE.search(f"INFO :      {text}")["done"] == "120"
    assert line("sft", 50, 500, 10.0, "steps", "loss 1.234").endswith("5.00steps/s], loss 1.234")


def test_off_a_terminal_every_line_is_passed_on_as_it_is():
    echoed, stream = [], io.StringIO()
    with Bars(echoed.append, stream) as bars:
        for text in (line("prior", 1, 4, 1.0), "other", line("prior", 4, 4, 2.0)):
            bars(text)
    assert (
        echoed == [line("prior", 1, 4, 1.0), "other", line("prior", 4, 4, 2.0)]
        and stream.getvalue() == ""
    )


def test_on_a_terminal_a_phase_is_one_bar_closed_by_any_other_line():
    echoed, stream = [], Terminal()
    with Bars(echoed.append, stream) as bars:
        bars(line("prior", 1, 4, 1.0))
        bars(line("prior", 3, 4, 2.0))
        bars("[prior] 4/4 replies in 2.5 s")
        bars(line("sft", 10, 100, 1.0, "steps", "loss 0.500"))
    assert echoed == ["[prior] 4/4 replies in 2.5 s"]
    drawn = stream.getvalue()
    assert "[prior]:  75%" in drawn and "3/4" in drawn and "clients/s" in drawn
    assert "[sft]:  10%" in drawn and "loss 0.500" in drawn


def test_an_exchange_that_waits_reports_its_progress_in_plain_lines(caplog):
    """The Messenger's wait: one node answers at once, one never does; while it waits, plain
    progress lines (count, rate, time left) go to the log."""
    grid = InProcessGrid({1: lambda msg: RecordDict(), 2: lambda msg: None})
    messenger = Messenger(grid, timeout=0.5, poll_seconds=0.05, report_seconds=0.1)
    messages = [
        Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in (1, 2)
    ]
    with caplog.at_level(logging.INFO, logger="fedsim"):
        with pytest.raises(PhaseFailed):  # the default quorum: every node
            messenger.exchange("probe", messages)
    reports = [LINE.search(r.getMessage()) for r in caplog.records]
    assert [(m["phase"], m["done"], m["total"]) for m in reports if m][:1] == [("probe", "1", "2")]
