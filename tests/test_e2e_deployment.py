"""A real SuperLink and two SuperNodes on loopback, over TLS with node authentication (a private
CA made for the run, each node registered), run a small FedTP experiment, then stop."""

import subprocess

from conftest import read_results


def _flower_processes() -> set[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines()
            if "flower-superlink" in line or "flower-supernode" in line}


def test_fedtp_through_superlink_and_two_supernodes(run_small):
    before = _flower_processes()
    code, log, out = run_small("hardware=deploy_local", "task.max_per_split=2")
    assert code == 0, log
    assert "deployment via SuperLink 127.0.0.1:" in log and "(TLS + node authentication)" in log
    res = read_results(out)
    assert res["supernodes"] == 2 and res["conversations"] == 8
    # each SuperNode hosts 2 validation conversations: 4 client vectors in the prior
    assert res["prior_clients"]["count"] == 4 and res["prior_clients"]["nodes"] == 2
    assert res["routers"]["fedmix"]["overall"]["turns"] > 0
    assert _flower_processes() <= before  # SuperLink and SuperNodes were stopped
