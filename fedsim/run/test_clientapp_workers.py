"""ClientApp workers: a fork serves its run's messages one after another and nothing else; a
failed message, a closed pipe or an idle time ends it; Flower's exit inside one returns."""

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from fedsim.flower.processes import BaseExecPlugin, add_exit_handler, registered_exit_handlers
from fedsim.run import superexec
from fedsim.run.clientapp_workers import (
    MessageDone,
    Worker,
    WorkerPool,
    end_message,
    install_once,
    serve,
    without_parent_monitor,
)
from fedsim.run.superexec import CLIENTAPP, ForkingPopen, remember_run


def fake_message(argv: list[str]) -> int:
    """Stands in for Flower's entry: notes the message in the file argv[1], exits with argv[2]."""
    with open(argv[1], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    return int(argv[2])


def fake_worker(conn, argv, _pull_backoff):
    serve(conn, argv, fake_message)


def served(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(name="popen")
def _popen(monkeypatch):
    monkeypatch.setattr(superexec, "run_worker", fake_worker)
    monkeypatch.setattr(superexec, "run_clientapp", lambda argv, _backoff: fake_message(argv))
    context = multiprocessing.get_context("fork")  # the fakes live in this test module
    popen = ForkingPopen(context, None, WorkerPool(per_run=1, idle=60.0))
    yield popen
    popen.pool.close_all()


def launch(popen: ForkingPopen, run_id: int, log: Path, code: int = 0):
    popen.run_id = run_id
    return popen.Popen([CLIENTAPP, str(log), str(code), "--parent-pid", "1"])


def test_a_worker_serves_its_runs_messages_in_one_process(popen, tmp_path):
    log = tmp_path / "messages.jsonl"
    first = launch(popen, 7, log)
    wait_for(popen.pool.workers[0].free)  # its first message done
    second = launch(popen, 7, log)
    assert second is first
    wait_for(lambda: len(served(log)) == 2)
    pids = {m["pid"] for m in served(log)}
    assert pids == {first.pid} and first.pid != os.getpid()
    assert "--parent-pid" in served(log)[0]["argv"] and "--parent-pid" not in served(log)[1]["argv"]


def test_another_runs_message_never_reaches_a_worker(popen, tmp_path):
    log = tmp_path / "messages.jsonl"
    worker = launch(popen, 7, log)
    wait_for(lambda: len(served(log)) == 1)
    other = launch(popen, 8, log)  # run 8 has room for a worker of its own
    wait_for(lambda: len(served(log)) == 2)
    assert other is not worker and {w.run_id for w in popen.pool.workers} == {7, 8}


def test_a_busy_worker_leaves_the_next_message_to_a_process_of_its_own(popen, tmp_path):
    log = tmp_path / "messages.jsonl"
    launch(popen, 7, log)  # never reported free before the next launch: busy
    popen.pool.workers[0].free = lambda: False
    launch(popen, 7, log)
    wait_for(lambda: len(served(log)) == 2)
    assert len(popen.pool.workers) == 1 and len({m["pid"] for m in served(log)}) == 2


def test_a_failed_message_ends_the_worker(popen, tmp_path):
    log = tmp_path / "messages.jsonl"
    worker = launch(popen, 7, log, code=1)
    worker.join(30)
    assert worker.exitcode == 0 and len(served(log)) == 1
    assert popen.pool.take(7) is None and not popen.pool.workers  # dropped, never handed a message
    replacement = launch(popen, 7, log)
    assert replacement.pid != worker.pid


def test_an_idle_worker_is_closed_and_its_process_ends(popen, tmp_path):
    log = tmp_path / "messages.jsonl"
    worker = launch(popen, 7, log)
    wait_for(lambda: popen.pool.workers[0].free())
    popen.pool.close_idle(now=time.monotonic() + 59)
    assert popen.pool.workers  # not yet idle for 60 s
    popen.pool.close_idle(now=time.monotonic() + 61)
    worker.join(30)
    assert worker.exitcode == 0 and not popen.pool.workers


def test_flowers_exit_in_a_worker_runs_the_messages_handlers_and_returns():
    ran = []
    add_exit_handler(lambda: ran.append("after"))
    add_exit_handler(lambda: ran.append("before"), run_before_force_exit=True)
    with pytest.raises(MessageDone) as done:
        end_message(3, "a message")
    assert done.value.code == 3 and ran == ["before", "after"] and not registered_exit_handlers


def test_the_parent_monitor_is_started_once_per_worker():
    argv = [CLIENTAPP, "--token", "t", "--parent-pid", "42", "--insecure"]
    assert without_parent_monitor(argv) == [CLIENTAPP, "--token", "t", "--insecure"]
    assert without_parent_monitor(argv[:3]) == argv[:3]


def test_the_run_of_the_task_being_launched_is_known_to_the_launch(monkeypatch):
    """Flower's plugin sees the task's run, its launch only the token: the wrap passes it on."""
    seen = []
    monkeypatch.setattr(
        BaseExecPlugin, "launch_task", lambda plugin, token, task: seen.append(popen.run_id)
    )
    popen = ForkingPopen(None)
    remember_run(popen)
    BaseExecPlugin.launch_task(None, "token", type("Task", (), {"run_id": 12})())
    assert seen == [12] and popen.run_id is None


def test_a_worker_ends_when_the_superexec_closes_its_pipe(tmp_path):
    log = tmp_path / "messages.jsonl"
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=fake_worker, args=(theirs, [CLIENTAPP, str(log), "0"], None))
    process.start()
    theirs.close()
    worker = Worker(process, ours, run_id=1)
    wait_for(worker.free)
    worker.close()
    assert process.exitcode == 0 and ours.closed
    assert served(log)[0]["pid"] == process.pid


def test_a_worker_installs_its_fab_once():
    """The worker runs the code it imported for its first message: a second install of the same
    FAB is skipped, another FAB's bytes are installed."""
    calls = []
    install = install_once(lambda content, **kw: calls.append(content) or f"dir-{len(calls)}")
    assert install(b"fab", skip_prompt=True) == install(b"fab", skip_prompt=True) == "dir-1"
    assert install(b"other fab", skip_prompt=True) == "dir-2" and calls == [b"fab", b"other fab"]
