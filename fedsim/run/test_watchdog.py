"""The watchdog finds a run's processes by working folder or token, and its ServerApps by
their command, and by nothing else."""

import os
import shutil
import subprocess

from fedsim.run.watchdog import ENV_KEY, _runs_server_app, run_processes


def test_a_run_process_is_found_by_its_folder_or_its_token_and_a_server_app_by_its_command(
    tmp_path,
):
    (tmp_path / "run").mkdir()
    sleep = ["sleep", "60"]
    in_folder = subprocess.Popen(sleep, cwd=tmp_path / "run")
    with_token = subprocess.Popen(sleep, cwd=tmp_path, env={**os.environ, ENV_KEY: "t0ken"})
    other = subprocess.Popen(sleep, cwd=tmp_path, env={**os.environ, ENV_KEY: "other"})
    (tmp_path / "flwr-serverapp").symlink_to(shutil.which("sleep"))
    server_app = subprocess.Popen([tmp_path / "flwr-serverapp", "60"], cwd=tmp_path)
    try:
        found = run_processes(tmp_path / "run", "t0ken")
        assert in_folder.pid in found and with_token.pid in found
        assert other.pid not in found and server_app.pid not in found and os.getpid() not in found
        assert run_processes(tmp_path / "run", "t0ken", spare=in_folder.pid) == [with_token.pid]
        assert _runs_server_app(server_app.pid) and not _runs_server_app(in_folder.pid)
    finally:
        for proc in (in_folder, with_token, other, server_app):
            proc.kill()
            proc.wait()
    assert run_processes(tmp_path / "run", "t0ken") == []
