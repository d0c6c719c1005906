"""FedDTRE's and FedBiscuit's own rounds on the virtual clock, in process as
tests/test_strategy_matrix.py runs the weight slots (five real clients, one of which crashes,
the tiny BERT in every model's place): each method's runner samples on the clock's quorum
(``RunContext.clock_grid``), the clock schedules every training round, the updates it counts
late are left out and counted, and the model still moves. FedBiscuit's regroups ask the clients
online at the round's start and group every client. The methods that need synchronous rounds
are refused before anything starts (tests/test_clock_config.py, and here from the config)."""

from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_strategy_matrix import (  # noqa: F401 (fixtures: slot_context, the gc freeze)
    CLIENTS,
    _cheap_collections,
    slot_context,
)

from conftest import data_root_override
from fedsim.clock.schedule import VirtualClock
from fedsim.config.compose import compose
from fedsim.config.schema import check
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime.messaging import Messenger
from fedsim_experiments.fedbiscuit import protocol as fedbiscuit
from fedsim_experiments.feddtre import protocol as feddtre
from fedsim_tasks.test_causal_lm import encoder_dir  # noqa: F401 (fixture: the tiny BERT)


def _on_clock(ctx, online_hours: float, **cfg_changes):
    """``ctx`` with a fresh Messenger on the synthetic clock (over-selection 1.5: a round
    samples half as many clients again as it keeps, the slowest are stragglers) and ``cfg``
    changed."""
    cfg = ctx.cfg.copy()
    OmegaConf.set_struct(cfg, False)
    for key, value in cfg_changes.items():
        OmegaConf.update(cfg, key, value)
    settings = OmegaConf.to_container(compose(["clock=synthetic"]).clock, resolve=True)
    settings |= {"over_selection": 1.5, "deadline": None}
    settings["synthetic"]["online_hours"] = online_hours
    messenger = Messenger(ctx.messenger.raw, timeout=60)
    messenger.partitions = {node: p for p, node in ctx.nodes.items()}  # as the ServerApp's whoami
    messenger.clock = VirtualClock.of(settings, CLIENTS, 0)
    return replace(ctx, cfg=cfg, messenger=messenger, plan=PrivacyPlan.fresh(cfg)), messenger


def _check_rounds(messenger: Messenger, phase: str, rounds: int, sampled: int, quota: int):
    """Every round of ``phase`` on the clock: ``sampled`` clients, ``quota`` awaited; the
    messenger's faults count the clock's stragglers and dropouts."""
    mine = [r for r in messenger.clock.rounds if r["phase"] == phase]
    assert [r["round"] for r in mine] == list(range(1, rounds + 1))
    for r in mine:
        assert len(r["clients"]) + messenger.faults[phase][r["round"]].get("failed", 0) == sampled
        assert r["quota"] == quota and r["accepted"] <= quota
        assert r["virtual_end"] >= r["virtual_start"]
        faults = messenger.faults[phase][r["round"]]
        assert (faults["stragglers"], faults["dropouts"]) == (r["stragglers"], r["dropouts"])
    return mine


def test_feddtre_trains_on_the_clock(slot_context):  # noqa: F811 (the imported fixture)
    """The federated baseline on Synthetic-Persona-Chat, 2 of 5 clients a round kept: 3
    sampled (4 of them reply: one crashes), the first 2 to finish accepted."""
    ctx = slot_context("feddtre_paper")
    ctx, messenger = _on_clock(ctx, 24.0)
    ctx = replace(ctx, protocol=replace(ctx.protocol, clients_per_round=2))
    out = feddtre.federated(ctx, "clock", ctx.cfg.protocol.methods.fedavg, "persona_chat")
    mine = _check_rounds(messenger, "persona_chat/clock/train", 2, 3, 2)
    assert sum(r["stragglers"] for r in mine) >= 1  # 3 sampled, 2 kept: a finisher is late
    assert any(not np.allclose(out["weights"][k], ctx.initial[k]) for k in ctx.initial)
    assert len(out["personalized"]["clients"]) == CLIENTS  # measured on every client, off the clock


def test_fedbiscuit_groups_and_trains_on_the_clock(slot_context):  # noqa: F811
    """SelectorGroups (U=3) over 5 clients, 40% a round (3 sampled, the first 2 kept): 1 warm-up
    round a selector, then a regroup and a group round each round; the clients are online 14
    hours a day, so a regroup may find some offline: they keep (or join) a group, and every
    client has one."""
    ctx = slot_context("fedbiscuit_paper")
    ctx, messenger = _on_clock(
        ctx,
        14.0,
        **{
            "num_rounds": 5,
            "protocol.fraction_train": 0.4,
            "protocol.warmup_rounds": 1,
            "protocol.regroup_every": 1,
        },
    )
    out = fedbiscuit.fedbiscuit(ctx, "clock", ctx.cfg.protocol.methods.fedbiscuit_u3)
    clocked = [r for r in messenger.clock.rounds if r["phase"] == "clock/train"]
    assert [r["round"] for r in clocked] == [1, 2, 3, 4, 5]
    for r in clocked:
        assert r["accepted"] <= r["quota"] and r["virtual_end"] >= r["virtual_start"]
    groups = out["groups"]
    assert [g["round"] for g in groups] == [4, 5]
    asked = [messenger.traffic["clock/regroup"][g["round"]]["messages"] for g in groups]
    assert min(asked) < CLIENTS  # some clients were offline at a regroup
    for g in groups:
        assert sum(g["sizes"]) == CLIENTS  # every client grouped, asked or not
        assert g["reported"] == messenger.faults["clock/regroup"][g["round"]]["accepted"]
    assert any(not np.allclose(s[k], ctx.initial[k]) for s in out["selectors"] for k in ctx.initial)


@pytest.mark.parametrize(
    "exp, why",
    [
        ("fede4rag_paper", "compared at one budget of optimizer steps"),
        ("fedtp", "its DP prior is one release of every sampled client's row"),
    ],
)
def test_the_methods_that_need_synchronous_rounds_refuse_the_clock(exp, why):
    cfg = compose([f"experiment={exp}", "clock=synthetic", data_root_override()])
    with pytest.raises(ValueError, match=why):
        check(cfg)
