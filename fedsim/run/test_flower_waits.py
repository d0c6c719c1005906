"""Flower's waits are shortened where fedsim starts the processes, and only there."""

import inspect
import re
import sys
import time

import pytest

from fedsim.flower.messages import ObjectUnavailableError, inflatable_utils, pull_objects
from fedsim.flower.processes import run_superexec, start_client_internal
from fedsim.run import launcher, supernode
from fedsim.run.tls import make_federation
from fedsim.runtime.flower_waits import (
    BACKOFF_CAP,
    SUPEREXEC_POLL_ENV,
    Sleeps,
    shorten_pull_backoff,
)

WAITS = {
    "superexec_poll": 0.1,
    "supernode_idle": 0.2,
    "supernode_reply": 0.05,
    "pull_backoff": 0.05,
}
STOCK = dict.fromkeys(WAITS)


@pytest.fixture
def restore_flower(monkeypatch):
    """Give Flower back its own sleeps and backoff after the test."""
    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)
    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))


def test_flower_still_hard_codes_the_sleeps_the_wrapper_maps():
    """A Flower upgrade that moves these waits fails here, not silently in a slow run."""
    source = inspect.getsource(start_client_internal)
    assert source.count("time.sleep(3)") == 1 and source.count("time.sleep(0.5)") == 2
    assert set(re.findall(r"\btime\.(\w+)", source)) == {"sleep"}


def test_supernode_command_runs_the_wrapper_only_when_a_wait_is_shortened(tmp_path):
    certs = make_federation(tmp_path, ["127.0.0.1"], nodes=1)
    args = ("127.0.0.1:9092", 0, 1, {"data-root": "/data"}, certs, True, 9094)
    stock = launcher.supernode_command(*args)
    assert (
        stock[0].endswith("flower-supernode") and launcher.supernode_command(*args, STOCK) == stock
    )
    fast = launcher.supernode_command(*args, WAITS)
    assert fast[:3] == [sys.executable, "-m", "fedsim.run.supernode"]
    assert fast[3:6] == ["--idle-wait=0.2", "--reply-wait=0.05", "--pull-backoff=0.05"]
    assert fast[6:] == ["--", *stock[1:]]  # TLS and the node's key exactly as without it
    assert "--root-certificates" in stock and "--auth-supernode-private-key" in stock


def test_superexec_poll_reaches_the_supernode_environment_and_flower_accepts_it(monkeypatch):
    assert launcher.supernode_env({"A": "1"}, STOCK) == {"A": "1"}
    env = launcher.supernode_env({"A": "1"}, WAITS)
    assert env == {"A": "1", SUPEREXEC_POLL_ENV: "0.1"}
    monkeypatch.setenv(SUPEREXEC_POLL_ENV, env[SUPEREXEC_POLL_ENV])
    assert run_superexec._get_task_poll_interval() == 0.1  # Flower's own reading of it


def test_the_wrapper_starts_flower_supernode_with_its_sleeps_mapped(monkeypatch, restore_flower):
    seen = {}

    def fake_flower_supernode():
        seen["argv"] = list(sys.argv)
        seen["clock"] = start_client_internal.time

    monkeypatch.setattr(supernode, "flower_supernode", fake_flower_supernode)
    supernode.main(
        [
            "--idle-wait=0.2",
            "--reply-wait=0.05",
            "--pull-backoff=0.05",
            "--",
            "--insecure",
            "--superlink",
            "127.0.0.1:9092",
        ]
    )
    assert seen["argv"] == ["flower-supernode", "--insecure", "--superlink", "127.0.0.1:9092"]
    assert isinstance(seen["clock"], Sleeps) and seen["clock"].monotonic is time.monotonic
    assert pull_objects.__kwdefaults__["initial_backoff"] == 0.05


def test_sleeps_map_flowers_literals_only(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = Sleeps(idle=0.2, reply=None)
    for seconds in (3, 0.5, 7):
        clock.sleep(seconds)
    assert slept == [0.2, 0.5, 7]


def test_a_missing_object_is_retried_sooner_and_as_patiently(restore_flower):
    calls = []

    def arrives_third_time(object_id):
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ObjectUnavailableError(object_id)
        return b"content"

    shorten_pull_backoff(0.05)
    assert pull_objects(["x"], arrives_third_time) == {"x": b"content"}
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert max(gaps) < 0.5  # Flower's own first retries come after 0.8-1.2 s and 1.6-2.4 s
    defaults = pull_objects.__kwdefaults__
    assert defaults["backoff_cap"] == BACKOFF_CAP and defaults["max_tries_per_object"] == 5000
