"""`fedsim run` with privacy.audit on the real 20-conversation slice: each DP release's measured
lower bound beside its accountant's epsilon, and a run whose releases are not private (noise
from the public seed) fails its privacy check, its results written."""

import pytest

from conftest import read_results

pytestmark = pytest.mark.e2e

AUDIT = "privacy.audit.enabled=true"


@pytest.mark.exhaustive  # the failing run below reports both bounds too
def test_an_audited_run_reports_both_bounds_and_holds(run_small):
    code, log, out = run_small(AUDIT)
    assert code == 0, log
    audit = read_results(out)["privacy"]["audit"]
    assert audit["holds"] is True
    assert [r["release"] for r in audit["releases"]] == [
        "prior",
        "dp/0.0/0",
        "dp/1.0/0",
        "dp/4.0/0",
    ]
    for row in audit["releases"]:
        assert row["canaries"] == 256 and row["confidence"] == 0.95 and row["holds"]
    no_noise = audit["releases"][1]
    assert (
        no_noise["epsilon_upper"] is None and no_noise["epsilon_lower"] > 2.5
    )  # nothing claimed, much shown
    assert 0 <= audit["releases"][3]["epsilon_lower"] < audit["releases"][3]["epsilon_upper"]
    assert (out / "privacy_audit.png").stat().st_size > 0
    assert "## Privacy audit" in (out / "summary.md").read_text()


def test_releases_with_the_public_seeds_noise_fail_the_run(run_small):
    code, log, out = run_small(AUDIT, "privacy.reproducible_noise=true")
    # the ServerApp raised, Flower marked the run failed: fedsim exits 1 with the error (Flower's CLI exits 0)
    assert code == 1 and "the reported epsilon does not hold for" in log, log
    audit = read_results(out)["privacy"]["audit"]
    broken = [r for r in audit["releases"] if not r["holds"]]
    assert audit["holds"] is False and "dp/4.0/0" in {r["release"] for r in broken}
    assert all(r["attack"] == "release minus the public seed's noise" for r in broken)
    assert "does not hold" in (out / "error.txt").read_text()
