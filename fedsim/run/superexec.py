"""``flower-superexec`` whose ClientApp processes fork from a warm process instead of starting cold.

    python -m fedsim.run.superexec --preload MOD[,MOD...] [--pull-backoff S] \
        [--workers N --worker-idle S] -- ARGS

ARGS are ``flower-superexec``'s own, passed through unchanged. Flower 1.42 runs every message of
a deployment in a new ``flwr-clientapp`` process (its executor: ``subprocess.Popen``), so each
message pays an interpreter start, Flower's imports and the app's libraries (numpy, scikit-learn,
datasets, torch, transformers: 2-5 s on a 2-core CPU) before any work. Here the executor's
``flwr-clientapp`` launch becomes a ``multiprocessing`` forkserver child: the forkserver imports
``--preload`` once when the SuperExec starts, and each message's process is a fork of it.
Flower's contract holds: one process per message, nothing carried between messages, the same
arguments (token, Runtime API, TLS, parent pid), the app loaded from the run's FAB.

The forkserver imports libraries only, never the app's own packages: Flower loads the app from
the FAB's folder and reuses any module already imported, so a preloaded ``fedsim`` would run the
installed code instead of the FAB's. The child drops the modules of this launcher's packages
before Flower loads the app, for the same reason. ``--pull-backoff``: the ClientApp's retry of a
message object its SuperNode is still pulling (``fedsim/runtime/flower_waits.py``); a warm process asks
within milliseconds of the task's creation, so Flower's 1 s first retry would be paid on most
messages. ``--workers``: up to N forks per run that serve its messages one after another
(``fedsim/run/clientapp_workers.py``), closed after ``--worker-idle`` seconds without one.
"""

from __future__ import annotations

import argparse
import functools
import gc
import multiprocessing
import subprocess
import sys
from multiprocessing import forkserver

from fedsim.flower.processes import (
    BaseExecPlugin,
    flower_superexec,
    flwr_clientapp,
    subprocess_executor,
)
from fedsim.run.clientapp_workers import MessageDone, Worker, WorkerPool, serve
from fedsim.run.supernode import after_separator
from fedsim.runtime.flower_waits import shorten_pull_backoff

CLIENTAPP = "flwr-clientapp"
APP_PACKAGES = ("fedsim", "fedsim_")  # the FAB's top-level packages (and this launcher's)


def forget_app_packages() -> None:
    """Drop the app's packages imported so far (this module's own, from unpickling the target):
    Flower then imports them from the FAB's folder, first on ``sys.path``."""
    for name in [n for n in sys.modules if n.split(".")[0].startswith(APP_PACKAGES)]:
        del sys.modules[name]


def prepare_fork(pull_backoff: float | None) -> None:
    """What every fork does before Flower's entry. The preloaded libraries' objects are frozen out
    of the garbage collector: they live as long as the process, and each full collection would
    walk all of them (torch and transformers: millions; it made parsing the task's data 6x slower
    in the fork than in a fresh process). ``multiprocessing`` starts processes by fork again, as in
    Flower's own process: a forkserver's child inherits the forkserver method, and a library's
    process (OpenVINO's telemetry sends one per event) then started a forkserver that re-imported
    this SuperExec's ``__main__`` (~4 s of CPU each, six per FedE4RAG evaluation)."""
    gc.freeze()
    multiprocessing.set_start_method("fork", force=True)
    if pull_backoff is not None:
        shorten_pull_backoff(pull_backoff)  # Flower's functions keep it after the modules go
    forget_app_packages()


def flower_entry(argv: list[str]) -> int:
    """Flower's ``flwr-clientapp`` entry with ``argv``; its exit code (a worker's ``flwr_exit``
    returns it, Flower's own ends the process)."""
    sys.argv = argv
    try:
        flwr_clientapp()
    except MessageDone as done:
        return done.code
    return 0


def run_clientapp(argv: list[str], pull_backoff: float | None) -> None:
    """A forked ``flwr-clientapp`` for one message."""
    prepare_fork(pull_backoff)
    flower_entry(argv)


def run_worker(conn, argv: list[str], pull_backoff: float | None) -> None:
    """A forked worker: ``argv``'s message, then the run's next ones the SuperExec hands it."""
    prepare_fork(pull_backoff)
    serve(conn, argv, flower_entry)


class ForkingPopen:
    """What Flower's subprocess executor calls as ``subprocess``: ``flwr-clientapp`` forks from
    the warm forkserver, any other command starts as before."""

    DEVNULL = subprocess.DEVNULL

    def __init__(
        self, context, pull_backoff: float | None = None, pool: WorkerPool | None = None
    ) -> None:
        self.context, self.pull_backoff, self.pool = context, pull_backoff, pool
        self.run_id: int | None = None  # the run of the task being launched (``remember_run``)

    def Popen(self, args: list[str], **kwargs):  # noqa: N802 (subprocess's name)
        multiprocessing.active_children()  # reaps the processes of earlier messages
        if args[0] != CLIENTAPP:
            return subprocess.Popen(args, **kwargs)  # pylint: disable=consider-using-with
        if self.pool is not None and self.run_id is not None:
            if worker := self.pool.take(self.run_id):
                worker.hand(args)
                return worker.process
            if self.pool.room(self.run_id):
                return self._start_worker(args)
        process = self.context.Process(target=run_clientapp, args=(args, self.pull_backoff))
        process.start()
        return process

    def _start_worker(self, args: list[str]):
        ours, theirs = self.context.Pipe()
        process = self.context.Process(target=run_worker, args=(theirs, args, self.pull_backoff))
        process.start()
        theirs.close()
        self.pool.add(Worker(process, ours, self.run_id))
        return process


def remember_run(popen: ForkingPopen) -> None:
    """Flower's plugin knows the task's run before it launches the task's process; the launch
    itself sees only its token. The plugin's launch is wrapped to tell ``popen`` the run."""
    launch = BaseExecPlugin.launch_task

    @functools.wraps(launch)
    def launch_task(plugin, token, task):
        popen.run_id = int(task.run_id)
        try:
            return launch(plugin, token, task)
        finally:
            popen.run_id = None

    BaseExecPlugin.launch_task = launch_task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fedsim.run.superexec", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--preload", default="", help="comma-separated modules the forkserver imports once"
    )
    parser.add_argument(
        "--pull-backoff", type=float, help="the ClientApp's first retry of an object (Flower: 1 s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="forks per run that serve its messages (0: one per message)",
    )
    parser.add_argument(
        "--worker-idle",
        type=float,
        default=60.0,
        help="seconds a worker waits for a message before it ends",
    )
    parser.add_argument(
        "flower_args", nargs=argparse.REMAINDER, help="-- then flower-superexec's arguments"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    context = multiprocessing.get_context("forkserver")
    entry = (
        flwr_clientapp.__module__
    )  # Flower's ClientApp entry and what it imports, not fedsim's modules
    context.set_forkserver_preload([entry, *filter(None, args.preload.split(","))])
    forkserver.ensure_running()  # the imports happen now, while the run starts, not at its first message
    pool = WorkerPool(args.workers, args.worker_idle) if args.workers > 0 else None
    popen = ForkingPopen(context, args.pull_backoff, pool)
    subprocess_executor.subprocess = popen
    if pool is not None:
        remember_run(popen)
        pool.reap_forever()
    sys.argv = ["flower-superexec", *after_separator(args.flower_args)]
    try:
        flower_superexec()
    finally:
        if pool is not None:
            pool.close_all()


if __name__ == "__main__":
    main()
