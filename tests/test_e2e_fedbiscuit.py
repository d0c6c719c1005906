"""FedBis and FedBiscuit (U=3) end to end through the Ray simulation on a small HH-RLHF slice,
with a crash and a timeout injected into the loss reports of the regroups: the regroups go on
with a quorum, the silent clients keep (or join) a group, and every fault is counted."""

import pytest

from conftest import fedsim_run, read_results

# minutes through Ray: the default suite plays each phase of the method through its real clients in
# process (tests/test_strategy_matrix.py, tests/test_reply_fuzz.py); this run is exhaustive
pytestmark = [pytest.mark.e2e, pytest.mark.exhaustive]

SLICE = [
    "experiment=fedbiscuit_paper",
    "task.max_pairs=300",
    "task.splits={test: 40, judge: 40, server: 20}",
    "task.n_topics=4",
    "task.partitioner.num_partitions=4",
    "task.partitioner.min_partition_size=10",
    "task.minority_share=0.5",
    "protocol.local_steps=2",
    "protocol.central_steps=10",
    "protocol.warmup_rounds=1",
    "protocol.regroup_every=1",
    "protocol.regroup_quorum=0.25",
    "protocol.fraction_train=0.5",
    "num_rounds=5",
    "~protocol.methods.fedbiscuit_u5",
    "~protocol.methods.central",
    "protocol.rlhf.sft_steps=2",
    "protocol.rlhf.sft_heldout=20",
    "protocol.rlhf.completions=[2]",
    "protocol.rlhf.dpo_steps=2",
    "protocol.rlhf.dpo_batch_size=2",
    "protocol.rlhf.eval_prompts=6",
    "protocol.rlhf.bootstrap=100",
    "protocol.rlhf.baseline_rounds=1",
    "protocol.rlhf.baseline_steps=1",
    "protocol.rlhf.judge_steps=10",
    "protocol.rlhf.max_new_tokens=8",
    "protocol.rlhf.selector_methods=[fedbis,fedbiscuit_u3]",
]


def test_fedbis_and_fedbiscuit_survive_faulty_regroups(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        *SLICE,
        f"results_dir={out}",
        f"protocol.rlhf.base_dir={tmp_path / 'policy'}",
        "faults.crash=[1]",
        "faults.timeout=[3]",
        "faults.message_types=[evaluate]",
        "faults.timeout_seconds=60",
        "round_timeout=45",
        timeout=900,
    )
    assert code == 0, log[-3000:]
    r = read_results(out)
    assert list(r["selectors"]) == ["central_majority", "fedbis", "fedbiscuit_u3", "oracle_groups"]
    for s in r["selectors"].values():
        assert 0.0 <= s["accuracy_majority"] <= 1.0
        assert abs(s["accuracy_majority"] + s["accuracy_minority"] - 1.0) < 1e-9 or "each" in s
    assert len(r["selectors"]["fedbiscuit_u3"]["each"]) == 3
    assert len(r["warmup"]["fedbiscuit_u3"]) == 3 and "oracle_groups" not in r["warmup"]
    (oracle,) = r["groups"]["oracle_groups"]  # fixed: minority clients train selector 0
    assert oracle["minority_share"] == [1.0, 0.0, 0.0] and sorted(oracle["sizes"]) == [1, 1, 2]
    assert r["minority_share"]["clients"] == 0.5 and 0 < r["minority_share"]["training_pairs"] < 1
    groups = r["groups"]["fedbiscuit_u3"]
    assert [g["round"] for g in groups] == [4, 5]  # after 3 warm-up rounds, every round
    for g in groups:
        assert sorted(g["sizes"]) == [1, 1, 2] and sum(len(m) for m in g["members"]) == 4
        assert g["reported"] == 2  # partitions 0 and 2; 1 crashed, 3 timed out
    assert groups[0]["joined"] == 2 and groups[1]["kept"] == 2  # never grouped: join; then keep

    def group_of(g, partition_id):
        return next(u for u, members in enumerate(g["members"]) if partition_id in members)

    assert all(group_of(groups[1], p) == group_of(groups[0], p) for p in (1, 3))
    faults = r["regroup_faults"]["fedbiscuit_u3"]
    assert all(
        f["failed"] == 1 and f["timed_out"] == 1 and f["accepted"] == 2 for f in faults.values()
    )
    assert r["faults"]["fedbiscuit_u3/regroup"] == faults
    comm = r["communication"]["fedbiscuit_u3"]
    assert comm["regroup_bytes"] > 2 * comm["bytes_per_round"] > 0  # every selector to every client
    assert r["communication"]["fedbis"]["regroup_bytes"] == 0
    assert (out / "selector_accuracy.png").is_file() and (out / "group_purity.png").is_file()
    # the policy phase: selector-labelled DPO and the two federated baselines, judged against the base
    policy = r["policy"]
    assert set(policy) == {"raw", "fedbis", "fedbiscuit_u3", "fedavg", "feddpo"}
    for method in ("fedbis", "fedbiscuit_u3"):
        assert 0.0 <= policy[method]["2"]["win_rate"] <= 1.0 and policy[method]["2"]["prompts"] == 6
        assert (policy[method]["2"]["unit"], policy[method]["2"]["clusters"]) == ("prompt", 6)
        lo, hi = policy[method]["2"]["ci"]
        assert lo <= policy[method]["2"]["win_rate"] <= hi
    assert policy["fedavg"]["clients"]["prompts"] == policy["feddpo"]["clients"]["prompts"] == 6
    assert (
        set(policy["raw"]) == {"2", "clients"} and policy["raw"]["2"]["win_rate"] == 0.5
    )  # sweep.baseline=raw
    assert set(r["rlhf"]["judge"]["agreement"]) == set(r["selectors"])
    assert r["rlhf"]["judge"]["pairs"] == 40 and 0.0 <= r["rlhf"]["judge"]["accuracy"] <= 1.0
    assert r["communication"]["policy_feddpo"]["bytes_per_round"] > 0
    h2h = r["rlhf"]["head_to_head"]["fedbiscuit_u3"][
        "2"
    ]  # against FedBis's policy, prompt by prompt
    assert (
        h2h["prompts"] == 6
        and h2h["reward_diff_ci"][0] <= h2h["reward_diff"] <= h2h["reward_diff_ci"][1]
    )
    summary = (out / "summary.md").read_text()
    assert (
        "win rate vs base" in summary
        and "derived, not measured" in summary
        and "against fedbis" in summary
    )
