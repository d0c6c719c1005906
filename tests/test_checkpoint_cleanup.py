"""A completed run's checkpoint/ is removed by `fedsim run` unless ``checkpoint.keep=true``; a
run that fails keeps it, for ``resume=``. Only Flower's part is stood in for (``launch``):
the config, the run file and the clean-up are fedsim's own."""

import json

import pytest

from fedsim.run import cli
from fedsim.run.launcher import RunFailed

RUN = [
    "experiment=fedtp_aggregate",
    "hardware.num_clients=4",
]  # sized by the override: reads no data


def _launch(fails: bool):
    """A stand-in for Flower's run: the ServerApp's journal under checkpoint/, then results (or a failure)."""

    def launch(cfg, pinned, nodes):
        out = cli.Path(cfg.results_dir)
        (out / "checkpoint" / "journal").mkdir(parents=True, exist_ok=True)
        (out / "checkpoint" / "journal" / "000001.exchange").write_text("{}")
        if fails:
            raise RunFailed("the ServerApp failed")
        (out / "results.json").write_text(json.dumps({"experiment": "fedtp_aggregate"}))
        return {"run_id": 1, "status": "finished:completed", "results_dir": str(out)}

    return launch


@pytest.mark.parametrize(
    ("extra", "fails", "kept"),
    [([], False, False), (["checkpoint.keep=true"], False, True), ([], True, True)],
)
def test_the_checkpoint_outlives_only_an_unfinished_run_unless_kept(
    tmp_path, monkeypatch, extra, fails, kept
):
    monkeypatch.setattr(cli, "launch", _launch(fails))
    out = tmp_path / "run"
    assert cli.run([*RUN, *extra, f"results_dir={out}"]) == (1 if fails else 0)
    assert (out / "checkpoint").exists() == kept
    if fails:  # what resume needs is there, and resume accepts it
        assert (out / cli.RUN_FILE).is_file() and cli.resumed(str(out), [])[-1] == "resume=true"
    assert (out / "results.json").exists() != fails
