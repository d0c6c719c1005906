"""Where a deployment exchange's seconds go: wall-clock marks, written only when the environment
variable ``FEDSIM_EXCHANGE_TRACE`` names a folder (``bench/deploy_exchange.py`` sets it).

The server marks each message when it is pushed and when its reply is pulled; the ClientApp
process marks its own start (the OS's process creation time), the import of
``fedsim.runtime.client_app``, the handler's entry, the built client and the handler's return. On one
machine (``hardware=deploy_local``) the marks share a clock, so their differences split an
exchange into Flower's dispatch, the process start, fedsim's set-up, the work and the reply.
Nothing of it enters a message: the bytes and results are those of an untraced run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil

TRACE_ENV = "FEDSIM_EXCHANGE_TRACE"


def mark(event: str, message_id: str = "", **fields) -> None:
    """Append one mark (one JSON line, one file per process: no interleaving) when tracing."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    line = {
        "event": event,
        "t": time.time(),
        "pid": os.getpid(),
        "message_id": message_id,
        **fields,
    }
    with open(Path(folder) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def process_start() -> float:
    """This process's creation (fork) time on the wall clock, to the kernel's 10 ms tick.
    psutil's ``create_time`` adds the boot time in whole seconds, which puts it up to 1 s off the
    other marks; the age since boot (``/proc/self/stat`` field 22) against CLOCK_BOOTTIME is not."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def mark_process_start(reused: bool = False) -> None:
    """The process's creation, before the interpreter ran (a fork of a warm process: the fork),
    and its parent's command line (which process started it); ``reused``: a ClientApp worker's
    next message (``fedsim/run/clientapp_workers.py``), which starts now in the same process."""
    if os.environ.get(TRACE_ENV):
        mark(
            "process-start",
            t=time.time() if reused else process_start(),
            reused=reused,
            parent=" ".join(psutil.Process().parent().cmdline()),
        )


def read(folder: Path) -> list[dict]:
    """Every mark of a traced run."""
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


STAGES = {  # stage: (from mark, to mark), each message's marks
    "dispatch": ("push", "process-start"),  # SuperLink -> SuperNode -> SuperExec -> a process
    "process": ("process-start", "app-import"),  # interpreter, Flower's imports, task pull, FAB
    "setup": ("app-import", "built"),  # the app's modules, fedsim's client: data, models
    "work": ("built", "leave"),  # the client's handler
    "reply": ("leave", "reply"),  # ClientApp -> SuperNode -> SuperLink -> ServerApp
}


def breakdown(marks: list[dict]) -> dict[tuple[str, int], dict[str, float]]:
    """``{(phase, round): {stage: mean seconds over the exchange's messages}}`` for the
    messages traced end to end. For a deployment, where each message has its own ClientApp
    process (in a Ray simulation an actor serves many), with one client per message (a
    SuperNode's batch of logical clients is one message to the server and several to the
    client, so it has no match). A ClientApp worker (``hardware.clientapp_workers``) serves
    several messages in one process: a message's start is its process's last start mark before
    the handler's entry, and where no import followed it (the app was imported for an earlier
    message) the import stage ends at the entry."""
    per_pid: dict[tuple[int, str], list[float]] = {}
    for m in marks:
        if m["event"] in ("process-start", "app-import"):
            per_pid.setdefault((m["pid"], m["event"]), []).append(m["t"])
    per_message: dict[str, dict] = {}
    for m in marks:
        if m["message_id"]:
            per_message.setdefault(m["message_id"], {})[m["event"]] = m
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    for events in per_message.values():
        if not {"push", "enter", "built", "leave", "reply"} <= set(events):
            continue
        pid = events["enter"]["pid"]
        t = {name: mark["t"] for name, mark in events.items()}
        start = max(x for x in per_pid[pid, "process-start"] if x <= t["enter"])
        t["process-start"] = start
        t["app-import"] = min(
            [x for x in per_pid.get((pid, "app-import"), []) if start <= x <= t["enter"]]
            or [t["enter"]]
        )
        key = (events["push"]["phase"], events["push"]["round"])
        rows.setdefault(key, []).append({s: t[b] - t[a] for s, (a, b) in STAGES.items()})
    return {key: {s: sum(r[s] for r in rs) / len(rs) for s in STAGES} for key, rs in rows.items()}
