"""ClientApp processes that serve one run's messages one after another, as a simulation's Ray actor
serves its clients (``hardware.clientapp_workers``).

Flower 1.42 runs every message of a deployment in a new process, so a deployment pays per message
what the simulation's warm actor pays once: the client's data and model, an evaluation encoder
(the LoRA model merged, converted and compiled; ``fedsim_tasks/financebench_rag/inference.py``).
A worker is a fork of the SuperExec's warm process that runs Flower's own ``flwr-clientapp``
entry for each message it is handed, with that message's own arguments (token, Runtime API, TLS):
Flower pulls the message, installs the FAB and pushes the reply exactly as in a process of its
own. Flower ends that entry with ``flwr_exit`` (its exit handlers, then ``sys.exit``, with a
timer that kills the process); in a worker the same handlers run and the entry returns instead.

What a worker may carry, and what it never does:
- it serves the run of its first message only: the SuperExec hands it messages of that run id
  (Flower's task names it before the launch), never another run's, never another SuperNode's;
- after a message that failed (Flower's exit code not 0: the handler raised, the reply could not
  be pushed) it exits, so a client whose handler raised starts again from a clean fork;
- the SuperExec closes it after ``idle`` seconds without a message and when the SuperExec ends
  (its pipe closes); Flower's parent monitor of its first message watches the SuperExec as well.
No library offers this: Flower's executors start a process per task, Ray's actors are the
simulation's, and ``multiprocessing.Pool`` cannot bind a process to a run or drop it on failure.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from fedsim.flower.processes import run_clientapp, trigger_exit_handlers
from fedsim.runtime import exchange_trace

FREE = "free"  # a worker's note after a message that succeeded


class MessageDone(Exception):  # noqa: N818 (a normal end, not an error)
    """Flower's ``flwr_exit`` inside a worker: the message is over with ``code``."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def end_message(code: int, *_args, **_kwargs) -> None:
    """``flwr_exit`` for a worker: Flower's exit handlers of the message (push the task's status,
    stop its heartbeat, close its connection) in Flower's two phases, then back to the loop."""
    trigger_exit_handlers(run_before_force_exit=True)
    trigger_exit_handlers(run_before_force_exit=False)
    raise MessageDone(code)


def without_parent_monitor(argv: list[str]) -> list[str]:
    """``argv`` without ``--parent-pid``: the first message's monitor thread lives as long as the
    worker, one more per message would pile up."""
    if "--parent-pid" not in argv:
        return argv
    at = argv.index("--parent-pid")
    return argv[:at] + argv[at + 2 :]


def install_once(install):
    """Flower's ``install_from_fab`` for a worker: a FAB it installed already (the same bytes) is
    not unzipped and checked again (0.2-0.8 s per message measured). The worker runs the code it
    imported for its first message whatever the files on disk say, so a second install could
    change nothing it runs."""
    installed: dict[str, Path] = {}

    def install_fab(fab_file, *args, **kwargs):
        if not isinstance(fab_file, bytes):
            return install(fab_file, *args, **kwargs)
        digest = hashlib.sha256(fab_file).hexdigest()
        if digest not in installed:
            installed[digest] = install(fab_file, *args, **kwargs)
        return installed[digest]

    return install_fab


def serve(conn: Connection, argv: list[str], run_message) -> None:
    """The worker's loop: ``run_message(argv)`` (Flower's entry, returning its exit code) for the
    first message, then for each ``argv`` the SuperExec sends, until it sends None, the pipe
    closes (the SuperExec is gone) or a message fails."""
    run_clientapp.flwr_exit = end_message  # the names Flower's entry calls, in its own module only
    run_clientapp.install_from_fab = install_once(run_clientapp.install_from_fab)
    while True:
        if run_message(argv) != 0:
            return
        conn.send(FREE)
        try:
            argv = conn.recv()
        except EOFError:
            return
        if argv is None:
            return
        argv = without_parent_monitor(argv)
        exchange_trace.mark_process_start(reused=True)


@dataclass
class Worker:
    """The SuperExec's handle of one worker: its process, its end of the pipe, its run."""

    process: BaseProcess
    conn: Connection
    run_id: int
    busy: bool = True
    idle_since: float = 0.0

    def free(self) -> bool:
        """Whether it waits for a message (reads its notes; a dead worker is never free)."""
        while self.busy and self.process.is_alive() and self.conn.poll():
            try:
                self.conn.recv()
            except (EOFError, OSError):
                break
            self.busy, self.idle_since = False, time.monotonic()
        return not self.busy and self.process.is_alive()

    def hand(self, argv: list[str]) -> None:
        """The next message (the pool's ``take`` marked it busy)."""
        self.conn.send(argv)

    def close(self) -> None:
        """Tell the worker to end (it is between messages: a busy one gets killed)."""
        try:
            self.conn.send(None)
        except OSError:
            pass  # it ended already
        self.conn.close()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


@dataclass
class WorkerPool:
    """Up to ``per_run`` workers per run; a message for which none is free and no more may start
    gets a process of its own (the caller's one-shot fork), as in Flower."""

    per_run: int
    idle: float
    workers: list[Worker] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, run_id: int) -> Worker | None:
        """A free worker of ``run_id``, marked busy, or None."""
        with self.lock:
            self._drop_dead()
            for worker in self.workers:
                if worker.run_id == run_id and worker.free():
                    worker.busy = True
                    return worker
            return None

    def room(self, run_id: int) -> bool:
        with self.lock:
            return sum(w.run_id == run_id for w in self.workers) < self.per_run

    def add(self, worker: Worker) -> None:
        with self.lock:
            self.workers.append(worker)

    def close_idle(self, now: float | None = None) -> None:
        """Close the workers free for ``idle`` seconds or more (a run that ended leaves its own)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            self._drop_dead()
            stale = [w for w in self.workers if w.free() and now - w.idle_since >= self.idle]
            for worker in stale:
                self.workers.remove(worker)
        for worker in stale:  # outside the lock: a launch never waits for a worker's exit
            worker.close()

    def close_all(self) -> None:
        with self.lock:
            for worker in self.workers:
                worker.close()
            self.workers.clear()

    def _drop_dead(self) -> None:
        for worker in [w for w in self.workers if not w.process.is_alive()]:
            self.workers.remove(worker)
            worker.conn.close()

    def reap_forever(self, every: float = 1.0) -> None:
        """A daemon thread of the SuperExec: idle workers close even when no message comes."""

        def loop():
            while True:
                time.sleep(every)
                self.close_idle()

        threading.Thread(target=loop, daemon=True, name="clientapp-workers").start()
