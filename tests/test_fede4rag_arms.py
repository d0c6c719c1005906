"""FedE4RAG's arms wired as issue 39 asks, in process through the real ClientApp (the tiny BERT
of ``fedsim_tasks/test_causal_lm.py`` in MiniLM's place, two companies' first pages, a real
question split with a small corpus): persistent local models without KD train with KD weight 0
and continue from their own weights, so their retrievers are local-only training's to the bit;
local-only training never averages; FedE4RAG's rounds log the KD / InfoNCE gradient ratio and
the clients' distance to the global model; each company's retriever is scored on its own
questions within its own filings and on the other company's."""

import copy
from functools import partial

import numpy as np
import pytest
import torch
from flwr.app import MessageType
from flwr_datasets.partitioner import NaturalIdPartitioner
from omegaconf import OmegaConf
from test_determinism import serve

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.config.node_local import from_run
from fedsim.config.schema import check
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record
from fedsim_clients import fede4rag_messages as keys
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fede4rag import report
from fedsim_tasks.financebench_rag.dataset import (
    client_documents,
    load_documents,
    load_questions,
    owners,
)
from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder
from fedsim_tasks.hf import build_encoder
from fedsim_tasks.test_causal_lm import encoder_dir  # noqa: F401 (fixture: the tiny BERT)

DATA = data_root_override()

COMPANIES = ["AES Corporation", "Boeing"]  # 3 and 8 of FinanceBench's questions
ANCHORED = {  # the anchoring control: FedAvg at the lr that moves it as far as FedE4RAG each round
    "run": "fedsim_experiments.fede4rag.protocol.federated",
    "kd_weight": 0.0,
    "he": False,
    "match_update_norm": {"method": "fede4rag_no_he", "reference": "fedavg"},
}


@pytest.fixture(scope="module")
def run(encoder_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """Every arm but HE trained and evaluated once; the configs each node received."""
    tmp = tmp_path_factory.mktemp("arms")
    cfg = compose(
        [
            "experiment=fede4rag_paper",
            DATA,
            f"task.companies=[{','.join(COMPANIES)}]",
            f"task.model={encoder_dir}",
            "task.max_seq_length=32",
            "task.pages_per_client=6",
            "task.corpus_pages_per_doc=2",
            "task.embedding_cache=null",
            f"client_state.dir={tmp / 'state'}",
            "num_rounds=2",
            "protocol.local_steps=2",
            "protocol.batch_size=2",
            "protocol.eval_backend=torch",
            "protocol.eval_pages_per_message=4096",
            "hardware.num_cpus=1",
            "protocol.eval_every_round=true",
        ]
    )
    sent = []

    def node(msg, partition):
        sent.append((partition, msg.metadata.message_type, dict(msg.content[keys.CONFIG])))
        return serve(msg, partition, 2, from_run(cfg))

    grid = InProcessGrid(
        {100 + p: partial(node, partition=p) for p in range(2)}, keep_replies=False
    )
    ctx = fede4rag.context(Messenger(grid, timeout=120), cfg, PrivacyPlan.fresh(cfg))
    methods = {
        name: fede4rag.train_and_evaluate(ctx, name, cfg.protocol.methods[name])
        for name in ("fedavg", "local_only", "persistent_no_kd", "fede4rag_no_he")
    }
    methods["anchored"] = fede4rag.train_and_evaluate(ctx, "anchored", OmegaConf.create(ANCHORED))
    grid.keep_replies = True  # the last round's replies, which the product average averages
    product = fede4rag.federated(
        ctx,
        "product",
        OmegaConf.create(
            {
                **OmegaConf.to_container(cfg.protocol.methods.persistent_no_kd),
                "lora_aggregation": "product",
            }
        ),
    )
    last = [
        (from_record(m.content[keys.ARRAYS]), float(m.content[keys.METRICS][keys.NUM_EXAMPLES]))
        for m in [m for m in grid.received if m.metadata.message_type == MessageType.TRAIN][-2:]
    ]
    return cfg, methods | {"product": {"global": from_record(product.arrays), "last": last}}, sent


def _trained(sent, method):
    return [(p, c) for p, kind, c in sent if kind == "train" and c.get(keys.METHOD) == method]


def test_the_authors_objective_is_the_default_and_the_weak_one_a_variant():
    paper, weak = compose(["experiment=fede4rag_paper"]), compose(["experiment=fede4rag_weak_kd"])
    assert (paper.protocol.temperature, paper.protocol.kd_weight) == (1.0, 100.0)
    assert (weak.protocol.temperature, weak.protocol.kd_weight) == (0.05, 1.0)
    assert list(paper.protocol.methods) == [
        "vanilla",
        "alone_largest",
        "alone_smallest",
        "centralized",
        "fedavg",
        "local_only",
        "persistent_no_kd",
        "fede4rag_no_he",
        "fede4rag",
    ]


def test_no_kd_trains_with_kd_weight_0_from_its_own_weights(run):
    cfg, methods, sent = run
    no_kd, kd = _trained(sent, "persistent_no_kd"), _trained(sent, "fede4rag_no_he")
    assert len(no_kd) == len(kd) == 4  # 2 companies x 2 rounds
    assert all(c[keys.KD_WEIGHT] == 0.0 and c[keys.LOCAL_MODEL] for _, c in no_kd)
    assert all(c[keys.KD_WEIGHT] == 100.0 and c[keys.LOCAL_MODEL] for _, c in kd)
    rounds = methods["persistent_no_kd"]["rounds"]
    assert all("kd" not in r and "kd-grad-ratio" not in r for r in rounds.values())
    # the companies' own retrievers: local-only training's to the bit (continued from their own
    # weights, the global never taken in), FedAvg's and KD's others
    own = {
        name: [c["weights_key"] for c in methods[name]["local"]["clients"].values()]
        for name in ("local_only", "persistent_no_kd", "fede4rag_no_he")
    }
    assert own["persistent_no_kd"] == own["local_only"]
    assert len(set(own["persistent_no_kd"])) == 2
    assert not set(own["fede4rag_no_he"]) & set(own["local_only"])
    assert methods["fedavg"]["weights_key"] not in own["local_only"]


def test_local_only_never_averages(run):
    cfg, methods, sent = run
    local = _trained(sent, "local_only")
    assert sorted((p, c[keys.SERVER_ROUND]) for p, c in local) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(c[keys.WEIGHTS] == keys.FROM_INITIAL and c[keys.KD_WEIGHT] == 0.0 for _, c in local)
    m = methods["local_only"]
    assert "weights_key" not in m and "valid" not in m  # no global model, none evaluated
    assert (
        m["local"]["model"] == "own" and m["steps"] == 8
    )  # the budget: 2 rounds x 2 steps x 2 companies
    distance = [m["rounds"][r]["client-distance"] for r in (1, 2)]
    moved = [m["rounds"][r]["update-norm"] for r in (1, 2)]
    assert (
        0 < distance[0] < distance[1] and 0 < moved[0] < moved[1]
    )  # drifting apart from the initial model


def test_fede4rag_logs_the_kd_gradient_ratio_and_the_distance_to_the_global_model(run):
    cfg, methods, sent = run
    for rnd, r in methods["fede4rag_no_he"]["rounds"].items():
        assert r["kd-grad-ratio"] > 0 and r["kd"] > 0, rnd
        assert r["update-norm"] > 0 and r["client-distance"] > 0, rnd
    assert all("kd-grad-ratio" not in r for r in methods["fedavg"]["rounds"].values())
    assert methods["fedavg"]["rounds"][1]["update-norm"] > 0


def test_the_anchoring_control_moves_each_round_as_far_as_fede4rag(run):
    """Its lr each round is protocol.lr x FedE4RAG's delta-update-norm over FedAvg's (what its
    clients were sent), and what its clients then add moves as far from the global model they
    received as FedE4RAG's did, with no KD: AdamW's step scales with the lr (here to 1%)."""
    cfg, methods, sent = run
    lr, rounds = cfg.protocol.lr, {n: methods[n]["rounds"] for n in ("fedavg", "fede4rag_no_he")}
    target = {r: rounds["fede4rag_no_he"][r]["delta-update-norm"] for r in (1, 2)}
    ratio = {r: target[r] / rounds["fedavg"][r]["delta-update-norm"] for r in (1, 2)}
    assert methods["anchored"]["lr_by_round"] == pytest.approx({r: lr * ratio[r] for r in (1, 2)})
    assert ratio[2] != pytest.approx(
        1.0, abs=0.1
    )  # FedE4RAG's own retrievers drift: a change of lr
    got = [
        (p, c[keys.SERVER_ROUND], c[keys.LR], c[keys.KD_WEIGHT])
        for p, c in _trained(sent, "anchored")
    ]
    assert sorted(got) == sorted(
        (p, r, pytest.approx(lr * ratio[r]), 0.0) for p in (0, 1) for r in (1, 2)
    )
    moved = {r: methods["anchored"]["rounds"][r]["delta-update-norm"] for r in (1, 2)}
    assert moved == pytest.approx(target, rel=0.01)


def test_every_federated_arm_is_evaluated_after_every_round(run):
    """The last round's evaluation is the final one (the same global model); round 1's is
    another model's."""
    cfg, methods, sent = run
    for name in ("fedavg", "persistent_no_kd", "fede4rag_no_he", "anchored"):
        by_round = methods[name]["by_round"]
        assert sorted(by_round) == [1, 2], name
        assert by_round[2]["valid"] == pytest.approx(
            {m: methods[name]["valid"][m] for m in by_round[2]["valid"]}
        )
        assert set(by_round[1]) == {"valid", "test"}
    assert "by_round" not in methods["local_only"]  # no global model
    assert list(report.trajectories({"methods": methods})["fedavg"]) == [1, 2]


def test_an_anchoring_control_names_arms_run_before_it():
    base = [
        "experiment=fede4rag_paper",
        "+protocol.methods.anchored.run=fedsim_experiments.fede4rag.protocol.federated",
        "+protocol.methods.anchored.kd_weight=0.0",
        "+protocol.methods.anchored.he=false",
    ]
    check(
        compose(
            [
                *base,
                "+protocol.methods.anchored.match_update_norm={method: fede4rag_no_he, reference: fedavg}",
            ]
        )
    )
    for match, key in (
        ("{method: fede4rag, reference: fedavg}", "method"),  # under HE: no update seen
        ("{method: fede4rag_no_he, reference: nothing}", "reference"),
        ("{method: fede4rag_no_he}", "method"),
    ):
        with pytest.raises(ValueError, match=rf"match_update_norm\.{key}=.* must name a plaintext"):
            check(compose([*base, f"+protocol.methods.anchored.match_update_norm={match}"]))
    with pytest.raises(ValueError, match=r"match_update_norm\.method='fede4rag_no_he' must name"):
        check(
            compose(
                [
                    "experiment=fede4rag_paper",
                    "+protocol.methods.fedavg.match_update_norm={method: fede4rag_no_he, reference: persistent_no_kd}",
                ]
            )
        )


def test_each_company_is_scored_on_its_own_and_the_others_questions(run):
    cfg, methods, sent = run
    for name in ("fedavg", "local_only", "fede4rag_no_he"):
        per = methods[name]["local"]["per_client"]
        for split in ("valid", "test"):
            ndcg = per[split]["ndcg@10"]
            assert set(ndcg["own"]) == set(ndcg["others"]) == {"0", "1"}, (
                name,
                split,
            )  # both own questions
            assert all(0 <= v <= 1 for v in [*ndcg["own"].values(), *ndcg["others"].values()])
            # two companies: a company's "others" is the other company's questions
            clients = methods[name]["local"]["clients"]
            assert ndcg["others"]["0"] == clients["0"]["by_client"][f"{split}-client1"]["ndcg@10"]
        asked = {
            c: methods[name]["local"]["clients"]["0"]["by_client"][f"test-client{c}"]["questions"]
            for c in ("0", "1")
        }
        assert (
            0 < asked["0"] <= 3 and 0 < asked["1"] <= 8
        )  # AES's and Boeing's questions of the test split
    fedavg = methods["fedavg"]["local"]["per_client"]["test"]["ndcg@10"]
    assert fedavg["own"] == fedavg["global"]  # no local model: a company's model is the global one
    assert "global" not in methods["local_only"]["local"]["per_client"]["test"]["ndcg@10"]


def test_product_averaging_gives_the_best_rank_r_adapters_of_the_mean_product(run):
    """Two drifted local models (persistent, no KD), tiny BERT (hidden 32) with rank-8 adapters:
    the mean of two products has rank up to 16, so the global pair is its best rank-8
    approximation (error = the tail of its singular values), nearer to it than the product of
    the averaged factors."""
    cfg, methods, sent = run
    glob, last = methods["product"]["global"], methods["product"]["last"]
    w = np.array([n for _, n in last]) / sum(n for _, n in last)
    pairs = [k for k in glob if "lora_A" in k]
    assert pairs
    for a in pairs:
        b = a.replace("lora_A", "lora_B")
        mean = sum(wi * (c[b].astype(np.float64) @ c[a]) for wi, (c, _) in zip(w, last))
        tail = np.sqrt((np.linalg.svd(mean, compute_uv=False)[8:] ** 2).sum())
        error = np.linalg.norm(glob[b] @ glob[a] - mean)
        assert error == pytest.approx(tail, rel=1e-3, abs=1e-6), a
        factors = sum(wi * c[b] for wi, (c, _) in zip(w, last)) @ sum(
            wi * c[a] for wi, (c, _) in zip(w, last)
        )
        assert error < np.linalg.norm(factors - mean), a


def test_the_summary_tables_every_arm(run, tmp_path):
    """A method without a global model (local_only) has no row in the global tables, but its
    companies' retrievers, its per-client scores and its rounds are reported."""
    cfg, methods, sent = run
    arms = {k: v for k, v in methods.items() if k != "product"}
    text = report.summary(
        {"budget_steps": 8, "methods": arms, "round_cost": {}}, RunOutput(tmp_path)
    )
    global_table = text.split("## Each company's retriever")[0]
    assert "| fedavg |" in global_table and "| local_only |" not in global_table
    assert "| local_only | valid | own |" in text and "| local_only | test |" in text
    assert "kd-grad-ratio" in text and "| fede4rag_no_he | 2 |" in text
    assert (tmp_path / "retrieval_by_method.png").is_file()
    assert "| fedavg | valid | " in text.split("## NDCG@10 of the global model after each round")[1]
    assert (tmp_path / "ndcg_by_round.png").is_file()


def test_a_wrong_arm_is_refused_before_the_run():
    with pytest.raises(ValueError, match="needs protocol.eval_local=true"):
        check(compose(["experiment=fede4rag_paper", "protocol.eval_local=false"]))
    with pytest.raises(ValueError, match="lora_aggregation=product cannot run: it runs under HE"):
        check(
            compose(
                ["experiment=fede4rag_paper", "+protocol.methods.fede4rag.lora_aggregation=product"]
            )
        )
    with pytest.raises(ValueError, match="is not one of"):
        check(
            compose(["experiment=fede4rag_paper", "+protocol.methods.fedavg.lora_aggregation=sum"])
        )
    cfg = compose(
        ["experiment=fede4rag_paper", "+protocol.methods.fedavg.lora_aggregation=product"]
    )
    check(cfg)
    assert OmegaConf.select(cfg, "protocol.methods.fedavg.lora_aggregation") == "product"


def test_the_kd_gradient_ratio_is_the_weighted_kd_gradient_over_infonces(encoder_dir):  # noqa: F811
    """One step (the measured one is the first and last): the student's weights are the same
    whatever the KD weight, so the ratio scales with it; a teacher other than the student pulls."""
    model = build_encoder(
        str(encoder_dir),
        32,
        {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]},
        0,
    )
    teacher = frozen_copy(model)
    torch.manual_seed(0)
    for name, p in teacher.named_parameters():
        if "lora_B" in name:
            p.data += 0.05 * torch.randn_like(p)
    pairs = [
        (f"What was revenue in quarter {i}?", f"Revenue in quarter {i} rose on product sales {i}")
        for i in range(8)
    ]
    ratio = {
        w: train_encoder(copy.deepcopy(model), pairs, 1, 4, 1e-3, 1.0, w, seed=0, teacher=teacher)[
            "kd-grad-ratio"
        ]
        for w in (1.0, 100.0)
    }
    assert ratio[1.0] > 0
    assert ratio[100.0] == pytest.approx(100 * ratio[1.0], rel=1e-3)
    itself = train_encoder(
        copy.deepcopy(model), pairs, 1, 4, 1e-3, 1.0, 1.0, seed=0
    )  # its own copy as teacher
    assert itself["kd-grad-ratio"] == 0.0


def test_by_sector_every_question_belongs_to_a_client_by_company_few_do():
    """What a partition leaves unscored: the four default companies own 24 of the 150 questions;
    one client per GICS sector owns all of them (a question on a filing without page text goes
    to the client holding its company's other filings)."""
    root = resolve_data_root()
    questions = list(load_questions(root))

    def owned(companies, by):
        def documents(p):
            return client_documents(root, companies, NaturalIdPartitioner(partition_by=by), p)

        clients = len(
            {
                d[by]
                for d in load_documents(root)
                if d["has_pages"] and (companies is None or d["company"] in companies)
            }
        )
        groups = {str(p): documents(p) for p in range(clients)}
        return {g: len(q) for g, q in owners(root, questions, groups).items()}

    assert owned(["AES Corporation", "Activision Blizzard", "Boeing", "PepsiCo"], "company") == {
        "0": 3,
        "1": 2,
        "2": 8,
        "3": 11,
    }
    sectors = owned(None, "gics_sector")
    assert len(sectors) == 9 and sum(sectors.values()) == 150 and min(sectors.values()) == 6
