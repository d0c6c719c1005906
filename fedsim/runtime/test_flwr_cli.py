"""Under `flwr run`: the SuperLink whose environment a run has is named by pid, and an override
of a client's own folder that its clients would not see is refused (issue 66)."""

import os
import stat
import subprocess
import sys

import pytest

from fedsim.config.compose import REFUSED, compose_checked
from fedsim.config.data import resolve_data_root
from fedsim.runtime.flwr_cli import checkout, refuse_settings_clients_miss

PROBE = "from fedsim.runtime.flwr_cli import superlink_note; print(superlink_note())"


def test_the_superlink_a_run_descends_from_is_named_with_how_to_stop_it(tmp_path):
    link = tmp_path / "flower-superlink"  # a stand-in parent, named as Flower's
    link.write_text(f'#!/bin/sh\n"{sys.executable}" -c "{PROBE}"\necho "pid $$"\n')
    link.chmod(link.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([str(link)], cwd=tmp_path, env=env, capture_output=True, text=True)
    note, pid = out.stdout.splitlines()[0], out.stdout.split("pid ")[-1].strip()
    assert f"SuperLink pid {pid}," in note and f"`kill {pid}`" in note, out
    assert f"in {tmp_path}:" in note
    bare = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert bare.stdout.strip() == ""  # no SuperLink above: nothing to name


def test_a_client_folder_the_clients_would_not_see_is_refused(tmp_path, monkeypatch):
    data = str(resolve_data_root(None))
    overrides = [f"data_root={data}", f"client_state.dir={tmp_path}"]
    cfg = compose_checked(overrides)
    monkeypatch.setenv("FEDSIM_DATA_ROOT", data)
    monkeypatch.delenv("FEDSIM_STATE_DIR", raising=False)
    with pytest.raises(REFUSED, match=rf"client_state.dir={tmp_path} reaches the ServerApp only"):
        refuse_settings_clients_miss(overrides, cfg)
    monkeypatch.setenv("FEDSIM_STATE_DIR", str(tmp_path))
    refuse_settings_clients_miss(overrides, cfg)  # the clients' environment names the same
    monkeypatch.delenv("FEDSIM_DATA_ROOT")
    with pytest.raises(
        REFUSED, match="FEDSIM_DATA_ROOT of the SuperLink's environment, which is unset"
    ):
        refuse_settings_clients_miss(overrides, cfg)
    refuse_settings_clients_miss([], cfg)  # nothing overridden: the clients' own values stand


def test_a_forced_override_of_a_client_folder_is_refused_too(tmp_path, monkeypatch):
    """The attack: Hydra's `++key=` (force) and `+key=` spell the same override; a check that
    reads only `key=` lets the ServerApp use a folder its clients never see."""
    monkeypatch.setenv("FEDSIM_DATA_ROOT", str(resolve_data_root(None)))
    monkeypatch.delenv("FEDSIM_STATE_DIR", raising=False)
    overrides = [f"++client_state.dir={tmp_path}"]
    cfg = compose_checked(overrides)
    assert cfg.client_state.dir == str(tmp_path)
    with pytest.raises(REFUSED, match=rf"client_state.dir={tmp_path} reaches the ServerApp only"):
        refuse_settings_clients_miss(overrides, cfg)


def test_the_run_log_is_never_written_through_a_planted_link(tmp_path):
    """The attack: a link planted as results_dir/fedsim.log would have the ServerApp append its
    log to the file it points at."""
    import logging

    from fedsim.runtime.server_app import keep_log

    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (tmp_path / "fedsim.log").symlink_to(victim)
    logger = logging.getLogger("fedsim-test-planted")
    with pytest.raises(OSError):
        keep_log(tmp_path / "fedsim.log", [logger])
    logger.error("through the link?")
    assert victim.read_text() == "mine\n"


def test_the_tasks_copy_of_the_data_root_cannot_be_overridden(tmp_path):
    """The attack: `task.data_root=` sets the folder the ServerApp's task reads while every
    client (under `fedsim run` and `flwr run` alike) reads `data_root`'s; no check named it."""
    for override in (f"task.data_root={tmp_path}", f"++task.data_root={tmp_path}"):
        with pytest.raises(REFUSED, match="task.data_root is the task's copy of data_root"):
            compose_checked([override])


def test_a_serverapp_host_without_git_records_no_commit(monkeypatch):
    """The Docker images have no git: the ServerApp's provenance says so and the run goes on
    (it failed with FileNotFoundError before any exchange)."""
    monkeypatch.setenv("PATH", "")
    assert checkout() == {"commit": None, "dirty": None, "note": "no git on the ServerApp's host"}
