"""A run of the strategy slot inside each of Flower's DP wrappers, in process (InProcessGrid, no
Ray), ends with what it spent in the results the ServerApp writes: the epsilon of its rounds at
the privacy entry's delta and noise multiplier, one release per round a client replied in."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from omegaconf import OmegaConf

from fedsim.client_app import dp_clipping_mod
from fedsim.config import CONF_DIR
from fedsim.inprocess_grid import InProcessGrid
from fedsim.messaging import ANY, Messenger, Policy
from fedsim.privacy import unamplified_epsilon
from fedsim.records import from_record, to_record
from fedsim.server_app import central_dp_section, privacy_results
from fedsim_experiments.common import build_strategy

CLIENTS, CRASH, ROUNDS = 4, 3, 3


def _client(partition: int):
    """Moves every weight by 0.3 (partition + 1); partition CRASH fails in round 2. Through the
    ClientApp's clipping mod, as the client-side wrappers need."""
    def train(msg: Message, context) -> Message:
        if partition == CRASH and msg.content["config"]["server-round"] == 2:
            raise RuntimeError("injected crash")
        w = from_record(msg.content["arrays"])["w"] + 0.3 * (partition + 1)
        return Message(RecordDict({"arrays": to_record({"w": w}), "metrics": MetricRecord({"num-examples": 10})}),
                       reply_to=msg)

    context = Context(run_id=1, node_id=partition, state=RecordDict(), run_config={}, node_config={})
    return lambda msg: dp_clipping_mod(msg, context, train).content


@pytest.mark.parametrize("privacy", ["dp_server_fixed", "dp_server_adaptive", "dp_client_fixed", "dp_client_adaptive"])
def test_a_dp_run_ends_with_its_epsilon_in_the_results(privacy):
    load = lambda group, name: OmegaConf.load(CONF_DIR / group / f"{name}.yaml")  # noqa: E731
    cfg = OmegaConf.create({"strategy": load("strategy", "fedavg"), "privacy": load("privacy", privacy),
                            "protocol": {"strategy_slot": {"loss_key": "loss"}}})
    messenger = Messenger(InProcessGrid({p + 1: _client(p) for p in range(CLIENTS)}), timeout=5)
    initial = to_record({"w": np.zeros(3, np.float32)})
    build_strategy(cfg, messenger, CLIENTS).start(messenger.grid("slot", Policy(ANY)), initial, ROUNDS, 5,
                                                  ConfigRecord({}))
    assert messenger.faults["slot/train"][2]["failed"] == 1  # round 2 noised over 3 replies: still sigma
    spent = privacy_results(messenger, messenger.noise)["central_dp"]
    expected = [unamplified_epsilon(1.0, 1e-5, t) for t in range(1, ROUNDS + 1)]  # sigma 1, delta 1e-5 (the YAML's)
    assert spent["phases"]["slot"] == {"rounds": ROUNDS, "epsilon": expected[-1], "epsilon_by_round": expected}
    assert spent["noise_multiplier"] == pytest.approx(1.0) and spent["epsilon"] == expected[-1]
    assert f"({expected[-1]:.3f}, 1e-05)" in central_dp_section(spent)
