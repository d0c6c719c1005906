"""The exchange trace: silent unless asked, one file per process, stages from the marks."""

import os
import time

import psutil
import pytest

from fedsim.runtime import exchange_trace
from fedsim.runtime.exchange_trace import STAGES, breakdown, mark, process_start, read


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(exchange_trace.TRACE_ENV, raising=False)
    mark("push", "m1")
    monkeypatch.setenv(exchange_trace.TRACE_ENV, str(tmp_path))
    mark("push", "m1", phase="test", round=1)
    assert [m["event"] for m in read(tmp_path)] == ["push"]
    assert [p.name for p in tmp_path.iterdir()] == [f"{os.getpid()}.jsonl"]


def test_process_start_is_this_process_creation():
    assert process_start() <= time.time()
    assert process_start() == pytest.approx(
        psutil.Process().create_time(), abs=1.5
    )  # psutil: whole-second boot time


def _marks(pid: int, message: str, phase: str, t0: float) -> list[dict]:
    client = [
        ("process-start", "", t0 + 0.5),
        ("app-import", "", t0 + 1.0),
        ("enter", message, t0 + 1.1),
        ("built", message, t0 + 2.0),
        ("leave", message, t0 + 2.5),
    ]
    marks = [{"event": e, "t": t, "pid": pid, "message_id": m} for e, m, t in client]
    return marks + [
        {"event": "push", "t": t0, "pid": 1, "message_id": message, "phase": phase, "round": 1},
        {"event": "reply", "t": t0 + 3.0, "pid": 1, "message_id": message},
    ]


def test_breakdown_splits_each_exchange_into_its_stages():
    marks = (
        _marks(10, "a", "test", 100.0)
        + _marks(11, "b", "test", 100.2)
        + _marks(12, "c", "tune", 50.0)
    )
    marks.append(
        {"event": "push", "t": 0.0, "pid": 1, "message_id": "lost", "phase": "test", "round": 1}
    )
    split = breakdown(marks)  # the message without a reply is left out
    assert set(split) == {("test", 1), ("tune", 1)} and list(split[("test", 1)]) == list(STAGES)
    assert split[("test", 1)] == pytest.approx(
        {"dispatch": 0.5, "process": 0.5, "setup": 1.0, "work": 0.5, "reply": 0.5}
    )
    assert sum(split[("tune", 1)].values()) == pytest.approx(
        3.0
    )  # the stages add up to the exchange


def test_breakdown_of_a_worker_takes_each_messages_own_start():
    """One process serves two messages (``hardware.clientapp_workers``): the second starts at its
    own start mark and, with no import of its own, its process stage ends at the handler's entry."""
    first = _marks(10, "a", "test", 100.0)
    second = [m for m in _marks(10, "b", "tune", 200.0) if m["event"] != "app-import"]
    split = breakdown(first + second)
    stages = {"dispatch": 0.5, "process": 0.5, "setup": 1.0, "work": 0.5, "reply": 0.5}
    assert split[("test", 1)] == pytest.approx(stages)
    assert split[("tune", 1)] == pytest.approx({**stages, "process": 0.6, "setup": 0.9})
