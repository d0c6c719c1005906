"""A run of the strategy slot inside each of Flower's DP wrappers, in process (InProcessGrid, no
Ray), ends with what it spent in the results the ServerApp writes: the epsilon of its rounds at
the privacy entry's delta and noise multiplier, one release per round a client replied in."""

import math
import re

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR, compose
from fedsim.config.schema import check
from fedsim.flower.strategies import strategy_utils
from fedsim.message_keys import DP_EPSILON, DP_EPSILON_PLD, DP_EPSILON_RDP
from fedsim.privacy.dp import NoiseSource, adaptive_noise_multiplier, release_epsilon
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime.client_app import dp_clipping_mod
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.server_app import central_dp_section, seed_server
from fedsim_experiments.common import build_strategy

CLIENTS, CRASH, ROUNDS = 4, 3, 3


def _client(partition: int):
    """Moves every weight by 0.3 (partition + 1); partition CRASH fails in round 2. Through the
    ClientApp's clipping mod, as the client-side wrappers need."""

    def train(msg: Message, context) -> Message:
        if partition == CRASH and msg.content["config"]["server-round"] == 2:
            raise RuntimeError("injected crash")
        w = from_record(msg.content["arrays"])["w"] + 0.3 * (partition + 1)
        return Message(
            RecordDict(
                {"arrays": to_record({"w": w}), "metrics": MetricRecord({"num-examples": 10})}
            ),
            reply_to=msg,
        )

    context = Context(
        run_id=1, node_id=partition, state=RecordDict(), run_config={}, node_config={}
    )
    return lambda msg: dp_clipping_mod(msg, context, train).content


@pytest.mark.parametrize(
    "privacy", ["dp_server_fixed", "dp_server_adaptive", "dp_client_fixed", "dp_client_adaptive"]
)
def test_a_dp_run_ends_with_its_epsilon_in_the_results(privacy):
    cfg = _slot_cfg(privacy)
    messenger = Messenger(InProcessGrid({p + 1: _client(p) for p in range(CLIENTS)}), timeout=5)
    plan = _plan(cfg, NoiseSource.fresh())
    initial = to_record({"w": np.zeros(3, np.float32)})
    build_strategy(cfg, plan, CLIENTS).start(
        messenger.grid("slot", Policy(ANY)), initial, ROUNDS, 5, ConfigRecord({})
    )
    assert (
        messenger.faults["slot/train"][2]["failed"] == 1
    )  # round 2 noised over 3 replies: still sigma
    spent = plan.report()["central_dp"]
    expected = [
        release_epsilon(1.0, 1e-5, t) for t in range(1, ROUNDS + 1)
    ]  # sigma 1, delta 1e-5 (the YAML's)
    last = expected[-1]
    assert spent["phases"]["slot"] == {
        "rounds": ROUNDS,
        "epsilon": last.reported,
        "epsilon_rdp": last.rdp,
        "epsilon_pld": last.pld,
        "epsilon_by_round": [e.reported for e in expected],
    }
    assert spent["noise_multiplier"] == pytest.approx(1.0) and spent["epsilon"] == last.reported
    summary = central_dp_section(spent)
    assert (
        f"({last.reported:.3f}, 1e-05) for the whole run (RDP {last.rdp:.3f}, PLD {last.pld:.3f})"
        in summary
    )


DIM = 20_000  # coordinates the measured noise std is taken over (its error about 0.5%)


def _plan(cfg, noise: NoiseSource) -> PrivacyPlan:
    """A run's privacy plan as the ServerApp builds it from ``cfg``, with ``noise``."""
    return PrivacyPlan(noise, 0, float(cfg.privacy.delta))


def _slot_cfg(privacy: str, fraction_train: float = 1.0):
    """The fedavg slot's config inside ``privacy``, the conf entries as a run composes them."""
    load = lambda group, name: OmegaConf.load(CONF_DIR / group / f"{name}.yaml")  # noqa: E731
    return OmegaConf.create(
        {
            "strategy": {**load("strategy", "fedavg"), "fraction_train": fraction_train},
            "privacy": load("privacy", privacy),
            "protocol": {"strategy_slot": {"loss_key": "loss"}},
        }
    )


def _slot(
    privacy: str, clients: int, moved: float, noise: NoiseSource, fraction_train: float = 1.0
):
    """The fedavg slot inside ``privacy`` over ``clients`` in-process clients, each moving weight 0
    by ``moved`` (through the ClientApp's clipping mod); its strategy, its messenger, its privacy plan."""
    cfg = _slot_cfg(privacy, fraction_train)

    def client(partition: int):
        def train(msg: Message, context) -> Message:
            w = from_record(msg.content["arrays"])["w"].copy()
            w[0] += moved
            return Message(
                RecordDict(
                    {"arrays": to_record({"w": w}), "metrics": MetricRecord({"num-examples": 10})}
                ),
                reply_to=msg,
            )

        context = Context(
            run_id=1, node_id=partition, state=RecordDict(), run_config={}, node_config={}
        )
        return lambda msg: dp_clipping_mod(msg, context, train).content

    messenger = Messenger(InProcessGrid({p + 1: client(p) for p in range(clients)}), timeout=5)
    plan = _plan(cfg, noise)
    return build_strategy(cfg, plan, clients), messenger, plan


@pytest.mark.parametrize("privacy", ["dp_server_adaptive", "dp_client_adaptive"])
@pytest.mark.parametrize("moved, grows", [(50.0, True), (1e-4, False)])
def test_adaptive_clipping_adds_the_noise_it_reports_and_moves_c_toward_the_quantile(
    privacy, moved, grows
):
    """Attack: subtract the known clipped mean from each released model and measure the noise.
    Andrew et al. (Alg. 1) noise the sum with the C its updates were clipped to, then move C
    toward the target quantile of unclipped updates: up when every update is clipped, down when
    none is. Flower noised with the C after its update (an effective multiplier 0.9 where 1.0 was
    reported) and moved C the other way. Measured over 10 rounds of 4 clients, each round's noise
    std is z_update C_t / m, and with the count's noise the effective multiplier is the reported one."""
    clients, rounds = 4, 10
    strategy, messenger, plan = _slot(privacy, clients, moved, NoiseSource.public(0))
    wrapper, grid = strategy.strategy, messenger.grid("slot", Policy(ANY))
    initial = to_record({"w": np.zeros(DIM, np.float32)})
    norms, multipliers = [], []
    for rnd in range(1, rounds + 1):
        norms.append(wrapper.clipping_norm)  # C_t: what this round's updates are clipped to
        replies = grid.send_and_receive(
            strategy.configure_train(rnd, initial, ConfigRecord({}), grid)
        )
        arrays, _ = strategy.aggregate_train(rnd, replies)
        noise = from_record(arrays)["w"][
            1:
        ]  # the clipped updates are 0 there: what is left is noise
        multipliers.append(float(np.std(noise)) * clients / norms[-1])
    assert multipliers == pytest.approx([wrapper.noise_multiplier] * rounds, rel=0.03)
    effective = adaptive_noise_multiplier(float(np.mean(multipliers)), wrapper.clipped_count_stddev)
    assert effective == pytest.approx(plan.central.account.noise_multiplier, rel=0.01)
    assert plan.central.account.noise_multiplier == pytest.approx(
        1.0
    )  # the YAML's sigma, as reported
    drift = math.log(wrapper.clipping_norm / norms[0])  # 10 rounds of 0.2 x (0.5 - unclipped share)
    assert drift > 0.5 if grows else drift < -0.5


def _samples(clients: int, noise: NoiseSource, rounds: int = 5) -> list[list[int]]:
    """The partitions (0-based, grid order) each round of the fedavg slot samples at fraction 0.5
    under dp_server_fixed (fedbiscuit_paper's fraction), the public seed fixed as the ServerApp
    fixes it."""
    seed_server(0)
    strategy, messenger, _ = _slot("dp_server_fixed", clients, 1.0, noise, fraction_train=0.5)
    grid, initial = messenger.grid("slot", Policy(ANY)), to_record({"w": np.zeros(3, np.float32)})
    return [
        sorted(
            m.metadata.dst_node_id - 1
            for m in strategy.configure_train(rnd, initial, ConfigRecord({}), grid)
        )
        for rnd in range(1, rounds + 1)
    ]


def test_adding_a_client_does_not_change_which_others_a_dp_round_samples(monkeypatch):
    """Attack on the bound's neighbours: one more client must change a round's release by its
    own clipped update only. Flower's fixed-size sample drawn from the public seed changed which
    2-6 other clients trained (their updates too entered the difference). Poisson sampling, each
    client on its own coin from the run's secret noise source, leaves the others as they were;
    the same secret (a resumed run) draws the same sample."""
    monkeypatch.setattr(
        strategy_utils, "random", strategy_utils.random
    )  # seed_server replaces it: given back
    secret = NoiseSource.from_key(b"run secret".ljust(32, b"\0"))
    twelve, thirteen = _samples(12, secret), _samples(13, secret)
    assert [[p for p in s if p != 12] for s in thirteen] == twelve
    assert _samples(12, secret) == twelve


def test_a_dp_round_samples_what_the_public_seed_cannot_tell(monkeypatch):
    """Attack: whoever knows the run's public seed recomputes which clients a round trained.
    Two runs with one seed and their own secrets sample differently; the rate is the slot's
    share (6 of 12 per round on average: the Poisson sampling the accountant's neighbours assume)."""
    monkeypatch.setattr(strategy_utils, "random", strategy_utils.random)
    one, other = (_samples(12, NoiseSource.from_key(bytes([k]) * 32), rounds=200) for k in (1, 2))
    assert one != other
    assert np.mean([len(s) for s in one]) == pytest.approx(6.0, abs=0.4)


def test_two_phases_never_share_noise():
    """Attack: two models released in one run (two phases, e.g. FedDTRE's fedavg on each
    dataset) with the same noise: their difference is the difference of the clipped means, no
    noise left, though the run's epsilon composes them as independent releases."""
    strategy, messenger, plan = _slot("dp_server_fixed", 4, 0.5, NoiseSource.public(0))
    other = build_strategy(_slot_cfg("dp_server_fixed"), plan, 4)  # one run: one plan, one account
    initial, released = to_record({"w": np.zeros(DIM, np.float32)}), []
    for label, phase in (("first", strategy), ("second", other)):
        grid = messenger.grid(label, Policy(ANY))
        replies = grid.send_and_receive(phase.configure_train(1, initial, ConfigRecord({}), grid))
        released.append(from_record(phase.aggregate_train(1, replies)[0])["w"])
    assert not np.allclose(released[0][1:], released[1][1:])
    assert plan.central.account.releases == {"first": 1, "second": 1}


def test_each_clients_dp_sgd_epsilon_is_kept_by_both_accountants():
    """A client's DP-SGD reply carries its epsilon (the smaller) beside its RDP and PLD
    (``fedsim_tasks/dp_sgd.py``); results.json keeps the three per client and round."""
    plan = PrivacyPlan(NoiseSource.fresh(), 0)
    messenger = Messenger(
        InProcessGrid(
            {
                n: (
                    lambda msg, n=n: RecordDict(
                        {
                            "metrics": MetricRecord(
                                {
                                    DP_EPSILON: 1.5 * n,
                                    DP_EPSILON_RDP: 2.0 * n,
                                    DP_EPSILON_PLD: 1.5 * n,
                                }
                            )
                        }
                    )
                )
                for n in (1, 3)
            }
        ),
        timeout=5,
        ledgers=[plan.dp_sgd.record],
    )
    messenger.exchange(
        "dp/train",
        [
            Message(
                RecordDict({"config": ConfigRecord({"server-round": 1})}),
                dst_node_id=n,
                message_type=MessageType.TRAIN,
            )
            for n in (1, 3)
        ],
    )
    privacy = plan.report()
    assert privacy["dp_sgd_epsilon"] == {"dp/train": {1: {1: 1.5, 3: 4.5}}}
    assert privacy["dp_sgd_epsilon_rdp"] == {"dp/train": {1: {1: 2.0, 3: 6.0}}}
    assert privacy["dp_sgd_epsilon_pld"] == {"dp/train": {1: {1: 1.5, 3: 4.5}}}


@pytest.mark.parametrize(
    "overrides, named",
    [
        # a DP wrapper labelled none: Flower's noise from the public seed, no account, "private"
        (["privacy=dp_server_fixed", "privacy.kind=none"], "privacy.kind=none"),
        (["privacy=dp_client_adaptive", "privacy.kind=he"], "privacy.kind=he"),
        # HEFedAvg labelled none: the server encrypts while the protocol and results say plaintext
        (["privacy=he_fedavg", "privacy.kind=none"], "privacy.kind=none"),
        (["privacy=he_fedavg", "privacy.kind=dp"], "privacy.kind=dp"),
        # SecAggPlus labelled none (results would say plaintext), a secagg label without it
        (["privacy=secagg", "privacy.kind=none"], "privacy.kind=none"),
        (["privacy=none", "privacy.kind=secagg"], "privacy.kind=secagg"),
        # a label without its wrapper, and a wrapper that is neither DP nor HE
        (["privacy=none", "privacy.kind=dp"], "privacy.kind=dp"),
        (
            [
                "privacy=he_fedavg",
                "privacy.wrapper._target_=fedsim_strategies.client_spread.ClientSpread",
            ],
            "ClientSpread",
        ),
    ],
)
def test_a_privacy_kind_that_is_not_its_wrappers_is_refused_before_the_run(overrides, named):
    """``privacy.kind`` is a config key anyone can set: the run's privacy follows the wrapper it
    builds, and a label that says otherwise is refused rather than reported."""
    cfg = compose(["experiment=fede4rag_paper", *overrides])
    with pytest.raises(ValueError, match=re.escape(named)):
        check(cfg)


@pytest.mark.parametrize(
    "experiment, privacy",
    [
        ("turn_sentiment_fedavg", "none"),
        ("turn_sentiment_fedavg", "dp_server_fixed"),
        ("turn_sentiment_fedavg", "dp_client_adaptive"),
        ("fede4rag_paper", "he_fedavg"),
        ("turn_sentiment_fedavg", "secagg"),
        ("fedtp", "secagg_ddp"),
    ],
)
def test_each_shipped_privacy_kind_is_its_wrappers(experiment, privacy):
    check(compose([f"experiment={experiment}", f"privacy={privacy}"]))
