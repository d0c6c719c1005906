"""Warm ClientApp processes: Flower's launch of ``flwr-clientapp`` forks from a preloaded process,
with Flower's own arguments, and the forked process loads the app's packages afresh."""

import inspect
import multiprocessing
import os
import subprocess
import sys

from fedsim.flower.processes import TASK_TYPE_TO_COMMAND, start_client_internal, subprocess_executor
from fedsim.run import launcher
from fedsim.run.superexec import CLIENTAPP, ForkingPopen
from fedsim.run.supernode import WarmSuperExec
from fedsim.run.tls import make_federation


def test_flower_still_starts_its_superexec_and_clientapps_as_these_wrappers_expect():
    """A Flower upgrade that changes either launch fails here, not in a cold deployment."""
    node = inspect.getsource(start_client_internal)
    assert node.count("subprocess.Popen(") == 1 and 'command = ["flower-superexec"]' in node
    executor = inspect.getsource(subprocess_executor.SubprocessExecutor.launch)
    assert executor.count("subprocess.Popen(") == 2 and CLIENTAPP in TASK_TYPE_TO_COMMAND.values()


def test_a_clientapp_launch_forks_from_the_warm_process_with_flowers_arguments(capfd):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["json"])
    launched = ForkingPopen(context).Popen([CLIENTAPP, "--help"])  # Flower's entry, parsing argv
    assert isinstance(launched, multiprocessing.process.BaseProcess)
    launched.join(60)
    assert launched.exitcode == 0 and "usage: flwr-clientapp" in capfd.readouterr().out
    other = ForkingPopen(context).Popen(["true"])  # any other command starts as before
    assert isinstance(other, subprocess.Popen) and other.wait(10) == 0


def test_the_forked_clientapp_imports_the_fabs_packages_not_the_installed_ones(tmp_path):
    fab = tmp_path / "fab"
    (fab / "fedsim").mkdir(parents=True)
    (fab / "fedsim" / "__init__.py").write_text("FROM_FAB = True\n")
    code = (
        "import sys; import fedsim.run.superexec as s; sys.path.insert(0, sys.argv[1]); "
        "s.forget_app_packages(); import fedsim; print(getattr(fedsim, 'FROM_FAB', False))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(fab)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True", out.stderr


def test_the_supernode_starts_fedsims_superexec_with_flowers_arguments():
    started = WarmSuperExec("json", 0.05).Popen(
        ["flower-superexec", "--help"], stdout=subprocess.PIPE, text=True
    )
    out, _ = started.communicate(timeout=120)
    assert started.returncode == 0 and "usage: flower-superexec" in out
    assert os.path.basename(started.args[0]).startswith("python")
    assert started.args[1:6] == [
        "-m",
        "fedsim.run.superexec",
        "--preload=json",
        "--pull-backoff=0.05",
        "--",
    ]


def test_supernode_command_passes_the_preload_list(tmp_path):
    certs = make_federation(tmp_path, ["127.0.0.1"], nodes=1)
    args = ("127.0.0.1:9092", 0, 1, {"data-root": "/data"}, certs, True, 9094, None)
    stock = launcher.supernode_command(*args)
    warm = launcher.supernode_command(*args, ["numpy", "torch"])
    assert warm[:4] == [sys.executable, "-m", "fedsim.run.supernode", "--preload=numpy,torch"]
    assert warm[4:] == ["--", *stock[1:]]  # TLS and the node's key exactly as without it
    workers = launcher.supernode_command(*args, ["numpy"], 2)
    assert workers[3:6] == ["--preload=numpy", "--workers=2", "--"]
    assert (
        launcher.supernode_command(*args, None, 2) == stock
    )  # workers are forks of the warm process


def test_the_supernode_passes_the_workers_to_its_superexec():
    assert WarmSuperExec("json", None, 2).options == ["--preload=json", "--workers=2"]
    assert WarmSuperExec("json", None).options == ["--preload=json"]


def report_start_method(out: str) -> None:
    from fedsim.run.superexec import prepare_fork

    prepare_fork(None)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(multiprocessing.get_start_method())


def test_a_forked_clientapp_starts_its_own_processes_as_flowers_would(tmp_path):
    """A forkserver's child inherits the forkserver method: a library's process (OpenVINO's
    telemetry, one per event) then started a new forkserver importing the SuperExec's __main__."""
    context = multiprocessing.get_context("forkserver")
    child = context.Process(target=report_start_method, args=(str(tmp_path / "method"),))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and (tmp_path / "method").read_text() == "fork"
