"""Each client's device and availability: read from FedScale's trace files or drawn from the
run's seed.

FedScale's two traces (its ``client_device_capacity`` and ``client_behave_trace``) are pickled
dicts keyed by a client id:

- device capacity: ``{'computation': ms per example of inference, 'communication': kbit/s}``;
  a training example costs three inferences (forward and backward, as FedScale's
  ``get_completion_time`` counts it);
- availability: ``{'active': [s], 'inactive': [s], 'finish_time': s, ...}``: the client is
  online from ``active[i]`` to ``inactive[i]``, the pattern repeating every ``finish_time``
  seconds (FedScale's ``is_active``).

The same dicts are read from a ``.json`` file. A pickle is read with an unpickler that resolves
no class or function at all (a trace holds numbers and lists only): an ordinary ``pickle.load``
of a file from elsewhere runs whatever code it names. Client (partition) ``p`` takes the trace
rows in sorted key order, row ``p mod rows``.

Hand-written rather than FedScale's own classes: FedScale is not a dependency of fedsim (its
package pins old torch and gRPC), and its ``is_active`` keeps a cursor that only moves forward
in time, where fedsim asks about any time (a resumed or asynchronous schedule).
"""

from __future__ import annotations

import bisect
import io
import json
import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim.seeding import stream

SYNTHETIC = stream("clock-synthetic", "partition")
"""a client's synthetic speed, bandwidth and daily window (public: anyone with the seed recomputes it)"""

TRAINING_PER_INFERENCE = 3.0  # FedScale: a training example costs forward + backward (2x) passes


class TraceError(ValueError):
    """A trace file that cannot be read, or a row of it that is not a client's trace (named)."""


@dataclass(frozen=True)
class Device:
    """A client's speed: seconds of training per example, and bandwidth in kbit/s (each way)."""

    seconds_per_example: float
    kbps: float

    def seconds(self, examples: float, bytes_down: int, bytes_up: int) -> float:
        """Virtual seconds of one task: the model down, ``examples`` trained, the update up."""
        return examples * self.seconds_per_example + (bytes_down + bytes_up) * 8 / 1000 / self.kbps


@dataclass(frozen=True)
class Availability:
    """Online from ``active[i]`` to ``inactive[i]`` (sorted, not overlapping), every ``period``
    seconds; ``period`` None: always online."""

    active: tuple[float, ...] = ()
    inactive: tuple[float, ...] = ()
    period: float | None = None

    def online_until(self, t: float) -> float | None:
        """The end of the online interval holding time ``t`` (inf: always online), None when the
        client is offline at ``t``."""
        if self.period is None:
            return math.inf
        base = t - t % self.period
        i = bisect.bisect_right(self.active, t - base) - 1
        if i < 0 or t - base > self.inactive[i]:
            return None
        if self.inactive[i] < self.period or self.active[0] > 0:
            return base + self.inactive[i]
        if len(self.active) == 1:  # online from 0 to the period's end: always
            return math.inf
        return base + self.period + self.inactive[0]  # the window goes on past the period's end


ALWAYS = Availability()


@dataclass(frozen=True)
class Profile:
    """One client as the clock sees it."""

    device: Device
    availability: Availability


def _load(path: Path) -> Mapping:
    """A trace file's dict, from JSON or from a pickle that may name no class."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".json":
            table = json.loads(data)
        else:
            table = _NoCode(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, json.JSONDecodeError, EOFError, ValueError) as exc:
        raise TraceError(f"{path}: not a trace file: {exc}") from exc
    if not isinstance(table, dict) or not table:
        raise TraceError(f"{path}: a trace is a non-empty dict of client id -> row")
    return table


class _NoCode(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(
            f"it names {module}.{name}: a trace holds numbers and lists only, and fedsim resolves "
            "no class or function from a trace file"
        )


def _number(row, key: str, positive: bool = True) -> float:
    value = row.get(key) if isinstance(row, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"'{key}' must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"'{key}' must be > 0, got {value!r}")
    return float(value)


def device_row(row) -> Device:
    """A device-capacity row (FedScale: ms per example of inference, kbit/s)."""
    ms = _number(row, "computation")
    return Device(TRAINING_PER_INFERENCE * ms / 1000, _number(row, "communication"))


def availability_row(row) -> Availability:
    """An availability row (FedScale: ``active``, ``inactive`` and ``finish_time`` in seconds)."""
    period = _number(row, "finish_time")
    spans = [row.get(k) if isinstance(row, dict) else None for k in ("active", "inactive")]
    if not all(isinstance(s, list) for s in spans):
        raise ValueError(f"'active' and 'inactive' must be lists, got {spans[0]!r}, {spans[1]!r}")
    active, inactive = (tuple(_number({"t": t}, "t", positive=False) for t in s) for s in spans)
    if not active or len(active) != len(inactive):
        raise ValueError(
            f"'active' and 'inactive' must be non-empty and of one length, got {len(active)} "
            f"and {len(inactive)}"
        )
    previous = 0.0
    for start, end in zip(active, inactive):
        if not previous <= start <= end <= period:
            raise ValueError(
                f"intervals must be sorted, apart, within [0, finish_time={period:g}]: "
                f"[{start:g}, {end:g}] after one ending at {previous:g}"
            )
        previous = end
    return Availability(active, inactive, period)


def read_trace(path: str | Path, parse) -> list:
    """The rows of a trace file in sorted key order, each through ``parse``; a row ``parse``
    refuses is named with the file."""
    path = Path(path)
    table = _load(path)
    rows = []
    for key in sorted(
        table, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else str(k))
    ):
        try:
            rows.append(parse(table[key]))
        except ValueError as exc:
            raise TraceError(f"{path}: row {key!r}: {exc}") from exc
    return rows


def trace_profiles(clients: int, device_capacity: str, availability: str | None) -> list[Profile]:
    """The ``clients`` profiles of FedScale's traces (``availability`` None: always online)."""
    devices = read_trace(device_capacity, device_row)
    windows = read_trace(availability, availability_row) if availability else [ALWAYS]
    return [Profile(devices[p % len(devices)], windows[p % len(windows)]) for p in range(clients)]


@dataclass(frozen=True)
class Synthetic:
    """The synthetic generator's settings (``conf/clock/synthetic.yaml`` types them)."""

    seconds_per_example: float  # median
    speed_sigma: float  # lognormal sigma of the speed
    kbps: float  # median bandwidth
    bandwidth_sigma: float  # lognormal sigma of the bandwidth
    online_hours: float  # hours online per day (24: always)
    day_seconds: float  # the availability's period


def synthetic_profiles(clients: int, seed: int, settings: Synthetic) -> list[Profile]:
    """``clients`` profiles drawn from the run's seed, client ``p`` from its own stream (the same
    whatever the number of clients): lognormal speed and bandwidth around their medians, and a
    daily window of ``online_hours`` starting at a uniform time of day."""
    return [_drawn(seed, p, settings) for p in range(clients)]


def _drawn(seed: int, partition: int, s: Synthetic) -> Profile:
    rng = np.random.default_rng(SYNTHETIC.seed(seed, partition=partition))
    speed, bandwidth, start = rng.lognormal(0.0, [s.speed_sigma, s.bandwidth_sigma]).tolist() + [
        float(rng.uniform(0.0, s.day_seconds))
    ]
    device = Device(s.seconds_per_example * speed, s.kbps * bandwidth)
    if s.online_hours >= 24:
        return Profile(device, ALWAYS)
    end = start + s.online_hours / 24 * s.day_seconds
    spans = (
        [(start, end)]
        if end <= s.day_seconds
        else [(0.0, end - s.day_seconds), (start, s.day_seconds)]
    )
    return Profile(
        device,
        Availability(tuple(a for a, _ in spans), tuple(b for _, b in spans), s.day_seconds),
    )
