"""Every experiment config composes and passes its protocol schema (the paper-scale ones too,
which cannot run here)."""

from pathlib import Path

import pytest

from fedsim.config import compose
from fedsim.schema import check

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_fits_its_schema(experiment):
    cfg = compose([f"experiment={experiment}"])
    protocol = check(cfg)
    assert protocol.name == cfg.protocol.name
