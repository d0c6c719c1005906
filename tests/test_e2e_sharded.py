"""Many logical clients per SuperNode through the real Ray simulation
(``hardware.clients_per_supernode``): FedTP's release is the one of one SuperNode per client,
computed in process through the real ClientApp handler (tests/test_sharded_grid.py). FedE4RAG's
methods run sharded in tests/test_e2e_fede4rag.py."""

import numpy as np
import pytest
from hydra.utils import instantiate
from test_sharded_grid import fedtp_round, supernodes

from conftest import data_root_override, fedsim_run, read_results
from fedsim.config.compose import compose
from fedsim.config.schema import entry

DATA = data_root_override()

# the sharded grid runs by default in process (tests/test_sharded_grid.py)
pytestmark = [pytest.mark.e2e, pytest.mark.exhaustive]

SLICE = ["experiment=fedtp_aggregate", "strategy.noise_multiplier=0", "task.max_per_split=6"]


@pytest.mark.parametrize("backend", ["messages", "batched"])
def test_fedtp_release_is_the_same_with_many_clients_per_supernode(tmp_path, backend):
    out = tmp_path / "sharded"
    code, log = fedsim_run(
        *SLICE,
        f"results_dir={out}",
        "hardware.clients_per_supernode=6",
        f"hardware.client_backend={backend}",
    )
    assert code == 0, log[-3000:]
    sharded = read_results(out)
    assert (sharded["clients"], sharded["supernodes"]) == (24, 4)
    assert sharded["faults"]["aggregate/train"]["1"]["accepted"] == 24
    cfg = compose([*SLICE, DATA])
    one_each, faults = fedtp_round(supernodes(24), cfg, instantiate(entry(cfg.strategy)))
    assert faults["accepted"] == 24
    np.testing.assert_allclose(sharded["released"], one_each, rtol=0, atol=1e-12)
