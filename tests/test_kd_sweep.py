"""The KD sweep: its config is refused before the run when wrong, and end to end through the
real simulation (2 company clients, a 2 x 2 grid at one budget per client, validation on the
shared corpus and per filing, a small FinanceBench slice, the offline MiniLM with LoRA)."""

import pytest

from conftest import fedsim_run, read_results
from fedsim.config.compose import compose
from fedsim.config.schema import check


@pytest.mark.parametrize(
    "override, refusal",
    [
        ("protocol.local_steps_grid=[96,25]", "each must be >= 1 and divide budget_steps=96"),
        ("protocol.local_steps_grid=[0]", "each must be >= 1"),
        ("protocol.local_steps_grid=[]", "must name at least one value"),
        ("protocol.kd_weights=[0,-1]", "kd_weights must be >= 0"),
        ("protocol.kd_weights=[1,1]", "must not repeat a value"),
        ("protocol.budget_steps=0", "budget_steps must be >= 1"),
        ("protocol.kd_weights=[heavy]", "heavy"),
        ("protocol.eval_per_filing=maybe", "eval_per_filing"),
        ("protocol.he=sometimes", "he"),
        ("protocol.eval_backend=tensorrt", "is not one of"),
        ("protocol.eval_nodes=0", "eval_nodes=0 must be >= 1"),
    ],
)
def test_sweep_config_is_refused_when_wrong(override, refusal):
    assert check(compose(["experiment=fede4rag_kd_sweep"])).local_steps_grid == [96, 24, 6]
    with pytest.raises(ValueError, match=refusal):
        check(compose(["experiment=fede4rag_kd_sweep", override]))


@pytest.mark.e2e
@pytest.mark.exhaustive  # a sweep of Flower runs; its refusals above run by default
def test_sweep_cells_share_the_budget_and_record_kd_and_distance(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        "experiment=fede4rag_kd_sweep",
        f"results_dir={out}",
        "task.companies=[AES Corporation,Boeing]",
        "task.pages_per_client=30",
        "task.n_valid=4",
        "task.corpus_pages_per_doc=8",
        f"task.embedding_cache={tmp_path / 'cache'}",
        f"task.he.key_dir={tmp_path / 'keys'}",
        f"client_state.dir={tmp_path / 'state'}",
        "protocol.budget_steps=4",
        "protocol.local_steps_grid=[4,2]",
        "protocol.kd_weights=[0,1]",
        "protocol.batch_size=4",
        "protocol.eval_pages_per_message=64",
        "protocol.eval_backend=torch",
        timeout=900,
    )  # tiny corpus: a compiled backend's build outweighs it
    assert code == 0, log[-3000:]
    r = read_results(out)
    cells = r["cells"]
    assert list(cells) == ["steps4_kd0", "steps4_kd1", "steps2_kd0", "steps2_kd1"]
    assert list(r["methods"]) == ["vanilla"]
    for cell in cells.values():
        assert cell["local_steps"] * cell["num_rounds"] == 4  # one budget per client
        rounds = cell["rounds"]
        assert sorted(rounds, key=int) == [str(i) for i in range(1, cell["num_rounds"] + 1)]
        for m in rounds.values():
            assert m["client-distance"] > 0 and m["update-norm"] > m["client-distance"] / 2
            assert ("kd" in m) == (cell["kd_weight"] > 0)
        for label in ("valid", "valid-filing"):
            assert cell[label]["questions"] <= 4 and 0 <= cell[label]["ndcg@10"] <= 1
        # a filing is a subset of the shared corpus: the per-filing store is the smaller one
        assert cell["valid-filing"]["corpus_pages"] <= cell["valid"]["corpus_pages"]
    assert "test" not in cells["steps4_kd0"]  # task.n_test=0: no test split, no test corpus
    assert (
        cells["steps4_kd1"]["rounds"]["1"]["kd-first"]
        < cells["steps4_kd1"]["rounds"]["1"]["kd"] * 10
    )
    summary = (out / "summary.md").read_text()
    assert "| steps2_kd1 |" in summary and "client-distance" in summary
    assert (out / "kd_by_round.png").is_file() and (out / "client-distance_by_round.png").is_file()
