"""A round's virtual schedule, computed from the clients' profiles (``fedsim/clock/traces.py``),
never slept.

A synchronous round starts when the previous one closed (later, if fewer clients are online than
the round samples: the server waits for them to check in). Each sampled client finishes at the
start plus its task's seconds (the model down, its examples trained, the update up, at its
speed and bandwidth); one that goes offline before then drops out. The round closes at the
first of: the moment the quota's last client finishes (the quota is the sampled count divided by
the over-selection factor), or the deadline (``clock.deadline`` seconds after the start). The
quota's first finishers are accepted; the other finishers are stragglers, their updates left
out (an asynchronous strategy applies them late instead: ``fedsim_strategies/asynchronous.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from fedsim.clock.traces import Profile, Synthetic, synthetic_profiles, trace_profiles

ACCEPTED, STRAGGLER, DROPOUT = "accepted", "straggler", "dropout"


class ClockError(RuntimeError):
    """The schedule cannot go on (never enough clients online at once)."""


@dataclass(frozen=True)
class Task:
    """One client's work in an exchange: its examples trained and the bytes each way."""

    partition: int
    examples: float
    bytes_down: int
    bytes_up: int


def profiles_of(settings: Mapping, clients: int, seed: int) -> list[Profile] | None:
    """The clients' profiles of the ``clock`` settings (None for ``clock=none``)."""
    if settings["kind"] == "none":
        return None
    if settings["kind"] == "synthetic":
        return synthetic_profiles(clients, seed, Synthetic(**settings["synthetic"]))
    trace = settings["trace"]
    return trace_profiles(clients, trace["device_capacity"], trace["availability"])


class Windows:
    """Every client's online intervals as flat arrays, so that who is online at a time is one
    vectorized test over all of them (a Python loop over 10,000 profiles per round, and one per
    step of a wait, cost more than the round it scheduled: ``bench/clock_overhead.py``)."""

    def __init__(self, profiles: list[Profile]):
        rows = [
            (p, start, end, profile.availability.period)
            for p, profile in enumerate(profiles)
            if profile.availability.period is not None
            for start, end in zip(profile.availability.active, profile.availability.inactive)
        ]
        self.clients = len(profiles)
        self.always = np.array([p.availability.period is None for p in profiles], dtype=bool)
        self.owner, self.start, self.end, self.period = (
            np.array([r[i] for r in rows], dtype=np.int64 if i == 0 else np.float64)
            for i in range(4)
        )

    def online(self, times: np.ndarray) -> np.ndarray:
        """(times x clients) whether each client is online at each time."""
        times = np.asarray(times, dtype=np.float64).reshape(-1, 1)
        norm = times % self.period
        hit = (self.start <= norm) & (norm <= self.end)
        mask = np.repeat(self.always[None, :], len(times), axis=0)
        rows, intervals = np.nonzero(hit)
        mask[rows, self.owner[intervals]] = True
        return mask

    def next_starts(self, t: float, of: np.ndarray) -> np.ndarray:
        """The sorted times after ``t`` at which an interval of the clients ``of`` (a mask) opens."""
        mine = of[self.owner]
        norm = t % self.period[mine]
        start = self.start[mine]
        return np.unique(t - norm + start + np.where(start > norm, 0.0, self.period[mine]))


class VirtualClock:
    """The run's virtual time (``now``, seconds) and every round's schedule (``rounds``)."""

    def __init__(self, profiles: list[Profile], deadline: float | None, over_selection: float):
        self.profiles, self.deadline, self.over_selection = profiles, deadline, over_selection
        self.windows = Windows(profiles)
        self.now = 0.0
        self.rounds: list[dict] = []
        self._online_now: tuple[float, np.ndarray] | None = None  # (now, who is online then)

    @classmethod
    def of(cls, settings: Mapping, clients: int, seed: int) -> VirtualClock | None:
        profiles = profiles_of(settings, clients, seed)
        if profiles is None:
            return None
        return cls(profiles, settings["deadline"], float(settings["over_selection"]))

    def online_mask(self, t: float | None = None) -> np.ndarray:
        """Whether each client is online at ``t`` (default: now; kept until ``now`` moves, as a
        round's sampling asks it more than once)."""
        if t is not None and t != self.now:
            return self.windows.online([t])[0]
        if self._online_now is None or self._online_now[0] != self.now:
            self._online_now = self.now, self.windows.online([self.now])[0]
        return self._online_now[1]

    def online(self, partitions: Iterable[int], t: float | None = None) -> list[int]:
        """Those of ``partitions`` online at ``t`` (default: now)."""
        partitions = np.asarray(list(partitions), dtype=np.int64)
        return partitions[self.online_mask(t)[partitions]].tolist()

    def wait_for(self, partitions: Iterable[int] | np.ndarray, need: int) -> list[int]:
        """Move ``now`` on to the first moment at least ``need`` of ``partitions`` are online
        (the count rises only when an interval opens: those times are tried in order, in
        batches growing from 16, for up to one longest period); those online then, in the
        order given."""
        partitions = np.asarray(partitions, dtype=np.int64)
        return partitions[self.wait_mask(partitions, need)].tolist()

    def wait_mask(self, partitions: np.ndarray, need: int) -> np.ndarray:
        """:meth:`wait_for` as a mask over ``partitions`` (an array): a round's sampling among
        10,000 clients then builds no Python list of them."""
        online = self.online_mask()[partitions]
        if online.sum() >= need:  # the usual case: enough online now, no search
            return online
        chosen = np.zeros(self.windows.clients, dtype=bool)
        chosen[partitions] = True
        horizon = self.now + float(self.windows.period.max(initial=0.0))
        most, batch = max(16, 4_000_000 // max(len(self.windows.owner), 1)), 16
        times = np.array([self.now])
        while True:
            counts = (self.windows.online(times) & chosen).sum(axis=1)
            if (counts >= need).any():
                self.now = float(times[np.argmax(counts >= need)])
                return self.online_mask()[partitions]
            later = self.windows.next_starts(float(times[-1]), chosen)
            if not len(later) or times[-1] > horizon:
                raise ClockError(
                    f"the clients' availability never has {need} of {len(partitions)} online "
                    f"at once (from virtual second {self.now:g}); sample fewer or lower "
                    "clock.over_selection"
                )
            times, batch = later[:batch], min(4 * batch, most)

    def finish(self, task: Task, start: float) -> tuple[float, bool]:
        """When ``task``, begun at ``start``, finishes, and whether its client stays online until then."""
        profile = self.profiles[task.partition]
        end = start + profile.device.seconds(task.examples, task.bytes_down, task.bytes_up)
        until = profile.availability.online_until(start)
        return end, until is not None and end <= until

    def quota(self, sampled: int) -> int:
        """The updates a round waits for: the sampled count over the over-selection factor."""
        return max(1, math.floor(sampled / self.over_selection + 1e-9))

    def close_round(
        self, phase: str, server_round: int, tasks: list[Task], sampled: int | None = None
    ) -> set[int]:
        """Schedule a synchronous round of ``tasks`` (the usable replies of ``sampled`` clients,
        default as many) from now; move ``now`` to its close; the partitions whose updates count."""
        start, quota = self.now, self.quota(len(tasks) if sampled is None else sampled)
        close_by = math.inf if self.deadline is None else start + self.deadline
        timed = [(task.partition, *self.finish(task, start)) for task in tasks]
        done = sorted((end, p) for p, end, stays in timed if stays and end <= close_by)
        accepted = {p for _, p in done[:quota]}
        if len(done) >= quota:
            self.now = done[quota - 1][0]
        elif close_by < math.inf:
            self.now = close_by
        else:
            self.now = max((end for _, end, stays in timed if stays), default=start)
        self.log(
            phase,
            server_round,
            start,
            [
                (
                    p,
                    end if stays else None,
                    ACCEPTED if p in accepted else STRAGGLER if stays else DROPOUT,
                )
                for p, end, stays in timed
            ],
            quota=quota,
        )
        return accepted

    def log(
        self, phase: str, server_round: int, start: float, clients: list[tuple], **extra
    ) -> dict:
        """Record a round (or an asynchronous server step) that began at ``start`` and ends now:
        ``clients`` as (partition, virtual finish or None for a dropout, status[, staleness])."""
        statuses = [c[2] for c in clients]
        entry = {
            "phase": phase,
            "round": server_round,
            "virtual_start": start,
            "virtual_end": self.now,
            **extra,
            "accepted": statuses.count(ACCEPTED),
            "stragglers": statuses.count(STRAGGLER),
            "dropouts": statuses.count(DROPOUT),
            "clients": [
                {
                    "partition": c[0],
                    "virtual_finish": c[1],
                    "status": c[2],
                    **({"staleness": c[3]} if len(c) > 3 else {}),
                }
                for c in sorted(clients, key=lambda c: (c[1] is None, c[1] or 0.0, c[0]))
            ],
        }
        self.rounds.append(entry)
        return entry

    def report(self) -> dict:
        """What results.json keeps under ``clock``."""
        return {
            "deadline": self.deadline,
            "over_selection": self.over_selection,
            "virtual_seconds": self.now,
            "stragglers": sum(r["stragglers"] for r in self.rounds),
            "dropouts": sum(r["dropouts"] for r in self.rounds),
            "rounds": self.rounds,
        }
