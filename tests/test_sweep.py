"""`fedsim run -m`: the multirun expansion, refusal before any run, a failed point recorded and
skipped, a resume that runs only what did not complete, `fedsim compare`, and a SIGTERM that
stops the sweep with nothing left running."""

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import tracemalloc
from functools import cache

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import FEDSIM, SMALL, fedsim_run, private_tmpdir, stop_sweep_mid_point
from fedsim.config.compose import CONF_DIR, ConfigError
from fedsim.config.data import REPO_ROOT
from fedsim.config.schema import typed_sweep
from fedsim.results import comparison, provenance
from fedsim.results.mlflow_sink import SweepRun, store_uri
from fedsim.run import cli
from fedsim.run.cli import prepare
from fedsim.run.sweep import MANIFEST, Sweep, _tail, expand, point_name
from fedsim.run.watchdog import run_processes


def test_expansion_is_the_cartesian_product_with_ranges_and_constants():
    points, swept = expand(["a=1,2", "seed=range(0,3)", "b=x", "c=${seed}"])
    assert swept == ["a", "seed"] and len(points) == 6
    assert points[0] == ["a=1", "seed=0", "b=x", "c=${seed}"]
    assert points[-1] == ["a=2", "seed=2", "b=x", "c=${seed}"]
    assert point_name(points[4], swept) == "a-2__seed-1"
    assert point_name(["f=[0,1]", "g=x"], ["f"]) == "f-_0_1_"


def test_a_bad_point_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "sweep"
    with pytest.raises(ConfigError, match="num_rounds=x"):
        Sweep(["hardware.num_clients=2", "num_rounds=1,x", f"results_dir={out}"], prepare)
    with pytest.raises(ConfigError, match="protocol.nonexistent"):
        Sweep(["seed=0,1", "protocol.nonexistent=3", f"results_dir={out}"], prepare)
    assert not out.exists()
    code = subprocess.run(
        [FEDSIM, "run", "-m", "seed=0,1", "strategy=fedavg,nope", f"results_dir={out}"],
        capture_output=True,
        text=True,
    )
    assert code.returncode == 2 and "'nope' is not a strategy" in code.stderr and not out.exists()


def test_a_baseline_value_the_sweep_does_not_run_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "sweep"
    with pytest.raises(ConfigError, match=r"gives num_rounds the values \['1', '2'\]"):
        Sweep(["num_rounds=1,2", "sweep.baseline='num_rounds=3'", f"results_dir={out}"], prepare)
    with pytest.raises(ConfigError, match="gives protocol.alpha the values none"):
        Sweep(["seed=0,1", "sweep.baseline='protocol.alpha=0.5'", f"results_dir={out}"], prepare)
    assert (
        Sweep(
            ["num_rounds=1,2", "sweep.baseline='num_rounds=1'", f"results_dir={out}"], prepare
        ).strict
        is False
    )
    assert not out.exists()


def test_a_typod_baseline_exits_2_before_any_point_runs_naming_the_choices(tmp_path):
    """``sweep.baseline=fedmixx`` ran minutes of full runs before the comparison refused it
    (exit 1), listing path parts (``0, 1, ehr, overall, test_freq``) as methods."""
    out = tmp_path / "sweep"
    code = subprocess.run(
        [FEDSIM, "run", "-m", "seed=0,1", "sweep.baseline=fedmixx", f"results_dir={out}"],
        capture_output=True,
        text=True,
    )
    assert code.returncode == 2 and not out.exists(), code.stderr
    assert "sweep.baseline=fedmixx" in code.stderr
    assert "methods of this experiment: fedmix, global, local, tfidf;" in code.stderr
    assert "seed=0|1" in code.stderr and "overall" not in code.stderr
    for wrong, named in [
        ("sweep.plan={primary: [routers.fedmix.overall.ehrr], seeds: 2}", "sweep.plan.primary[0]"),
        ("sweep.contrasts=[{metric: ehr_gian, equal_at: 0}]", "sweep.contrasts[0].metric"),
        ("sweep.effect_of_interest=[{metric: x, size: 1, source: s, baseline: fedmx}]", "fedmx"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            Sweep(["seed=0,1", wrong, f"results_dir={out}"], prepare)
    assert Sweep(["seed=0,1", "sweep.baseline=fedmix", f"results_dir={out}"], prepare).methods == [
        "fedmix",
        "global",
        "local",
        "tfidf",
    ]
    assert not out.exists()


def test_a_comparison_lists_the_experiments_methods_not_parts_of_paths(tmp_path):
    _record(tmp_path / "sweep")
    split = {r: {"overall": {"ehr": 0.5}, "test_freq": {"ehr": 0.4}} for r in ("tfidf", "fedmix")}
    for seed in ("seed-0", "seed-1"):
        (tmp_path / "sweep" / seed / "results.json").write_text(json.dumps({"routers": split}))
    settings = typed_sweep(OmegaConf.load(CONF_DIR / "config.yaml").sweep, {"baseline": "fedmx"})
    with pytest.raises(comparison.ComparisonRefused) as found:
        comparison.build(tmp_path / "sweep", settings, methods=["fedmix", "tfidf"])
    assert "methods: fedmix, tfidf;" in str(found.value)
    with pytest.raises(comparison.ComparisonRefused, match="overall"):  # what it listed before
        comparison.build(tmp_path / "sweep", settings)


def test_a_plan_is_hashed_before_the_first_run_and_a_resume_with_another_is_refused(tmp_path):
    out = tmp_path / "sweep"
    plan = "sweep.plan={primary: [routers.fedmix.overall.ehr], seeds: 2}"
    sweep = Sweep(["seed=0,1", plan, f"results_dir={out}"], prepare)
    sweep.save()  # what run() writes before the first point
    kept = json.loads((out / MANIFEST).read_text())["plan"]
    assert kept["settings"] == {
        "primary": ["routers.fedmix.overall.ehr"],
        "alpha": 0.05,
        "seeds": 2,
        "looks": [2],
        "spending": "obrien_fleming",
    }
    canonical = json.dumps(kept["settings"], sort_keys=True, separators=(",", ":")).encode()
    assert kept["sha256"] == hashlib.sha256(canonical).hexdigest()
    assert Sweep(["seed=0,1", plan, f"resume={out}"], prepare).manifest["plan"] == kept
    for changed in (
        [plan.replace("seeds: 2", "seeds: 2, alpha: 0.1")],
        [plan.replace("fedmix", "local")],
        [],
    ):
        with pytest.raises(ConfigError, match="a plan cannot change once the sweep has run"):
            Sweep(["seed=0,1", *changed, f"resume={out}"], prepare)


def test_a_malformed_plan_is_refused_before_anything_runs_naming_its_key(tmp_path):
    out = tmp_path / "sweep"
    for plan, key in (
        ("{primary: [x], seeds: 1}", "sweep.plan.seeds"),
        ("{primary: [x], seeds: 4, alpha: 1.5}", "sweep.plan.alpha"),
        ("{primary: [x], seeds: 4, looks: [3, 2]}", "sweep.plan.looks"),
        ("{primary: [x], seeds: 4, spending: linear}", "sweep.plan.spending"),
    ):
        code = subprocess.run(
            [FEDSIM, "run", "-m", "seed=0,1", f"sweep.plan={plan}", f"results_dir={out}"],
            capture_output=True,
            text=True,
        )
        assert code.returncode == 2 and key in code.stderr and not out.exists(), (plan, code.stderr)


@pytest.mark.e2e
@pytest.mark.exhaustive  # 170 s of Flower runs; the SIGTERMed sweep below runs by default
def test_failed_point_is_recorded_and_resume_reruns_only_what_did_not_complete(tmp_path):
    # the second point's exchanges time out at once: a real run that fails after it started
    sweep = [
        *SMALL,
        "round_timeout=600,0.01",
        "logging.mlflow=true",
        f"logging.mlflow_dir={tmp_path / 'mlflow'}",
    ]
    out = tmp_path / "sweep"
    code, log = fedsim_run("-m", *sweep, f"results_dir={out}", timeout=600)
    assert code == 1, log
    manifest = json.loads((out / MANIFEST).read_text())
    runs, prov = manifest["runs"], manifest["provenance"]
    head = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert (
        prov["git"]["commit"] == head.stdout.strip() and prov["packages"] == provenance.packages()
    )
    assert prov["command"]["line"] == shlex.join(
        ["fedsim", "run", "-m", *sweep, f"results_dir={out}"]
    )
    assert prov["machine"]["cores"] == os.cpu_count() and prov["started"] <= prov["ended"]
    parent = _mlflow_runs(tmp_path)[
        manifest["mlflow_run_id"]
    ]  # the sweep's MLflow run, parent of the points'
    assert (
        parent.info.status == "FAILED"
        and parent.data.tags["mlflow.source.git.commit"] == prov["git"]["commit"]
    )
    children = [
        r
        for r in _mlflow_runs(tmp_path).values()
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    ]
    assert [c.info.run_name for c in children] == [runs[0]["name"]]  # the completed point
    assert children[0].data.tags["mlflow.source.git.commit"] == prov["git"]["commit"]
    assert "summary.md" in {
        a.path
        for a in MlflowClient(store_uri(tmp_path / "mlflow")).list_artifacts(parent.info.run_id)
    }
    assert [r["status"] for r in runs] == ["completed", "failed"] and runs[1]["error"]
    assert "sweep run 2/2" in log and "2/2 runs done [" in log and "1 runs failed" in log
    ok = out / runs[0]["name"]
    assert json.loads((ok / "point.json").read_text())["swept"] == {"round_timeout": "600"}
    ok_log = (ok / "fedsim.log").read_text()
    assert (out / "summary.md").is_file() and (out / "comparison.json").is_file()

    code, log = fedsim_run("-m", *sweep, f"resume={out}", timeout=600)
    assert code == 1 and "1 already completed" in log and "sweep run 1/2" not in log, log
    manifest = json.loads((out / MANIFEST).read_text())
    assert (
        manifest["provenance"] == prov and len(manifest["resumed"]) == 1
    )  # the first session's, then the resume's
    assert manifest["resumed"][0]["command"]["line"].endswith(f"resume={out}")
    assert (ok / "fedsim.log").read_text() == ok_log  # the completed point did not run again
    assert (out / runs[1]["name"] / "fedsim.log").read_text().count("fedsim: run failed") == 2

    code, log = fedsim_run("-m", *SMALL, "round_timeout=600,1,2", f"resume={out}")
    assert code == 2 and "other points" in log

    compared = subprocess.run(
        [
            FEDSIM,
            "compare",
            str(out),
            "sweep.metrics=[routers.*.overall.ehr]",
            "--output",
            str(tmp_path / "cmp"),
        ],
        capture_output=True,
        text=True,
    )
    assert compared.returncode == 0, compared.stderr
    groups = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["groups"]
    assert set(groups[0]["metrics"]) == {
        f"routers.{r}.overall.ehr" for r in ("tfidf", "global", "local", "fedmix")
    }
    for bad in ("sweep.interval=nope", "sweep.nokey=1", "seed=1"):
        refused = subprocess.run([FEDSIM, "compare", str(out), bad], capture_output=True, text=True)
        assert refused.returncode == 2 and "fedsim: compare:" in refused.stderr, bad


def _mlflow_runs(tmp_path) -> dict:
    client = MlflowClient(store_uri(tmp_path / "mlflow"))
    return {
        r.info.run_id: r
        for r in client.search_runs([client.get_experiment_by_name("fedtp").experiment_id])
    }


@pytest.mark.e2e
def test_sigterm_stops_the_running_point_and_the_sweep_leaving_nothing(tmp_path):
    root = private_tmpdir()
    out = tmp_path / "sweep"
    try:
        stop_sweep_mid_point([*SMALL, "seed=0,1"], out, root, tmp_path / "log.txt")
        deadline = time.monotonic() + 30
        while run_processes(root) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert run_processes(root) == [], "processes left by the stopped sweep"
        runs = json.loads((out / MANIFEST).read_text())["runs"]
        assert [r["status"] for r in runs] == ["interrupted", "pending"]
        assert "resume=" in (tmp_path / "log.txt").read_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_point_told_to_stop_is_interrupted_whatever_it_exits_with():
    """The sweep was sent SIGTERM one second into a point: the point died of the forwarded signal
    (-15) before its own handler could exit 143, the sweep recorded a failure and started the next
    point. A point of a sweep told to stop was interrupted; one that exits alone keeps its code."""
    from fedsim.run.sweep import INTERRUPTED, exit_code

    assert exit_code(-15, [signal.SIGTERM]) == 143 and exit_code(1, [signal.SIGINT]) == 130
    assert exit_code(143, [signal.SIGTERM]) in INTERRUPTED and exit_code(0, [signal.SIGTERM]) == 0
    assert exit_code(-15, []) == -15 and exit_code(1, []) == 1


def test_a_fedsim_package_planted_in_the_working_folder_is_not_run(tmp_path, monkeypatch):
    """The attack: another local user plants ``fedsim/run/cli.py`` in a shared folder (``/tmp``) the
    user starts a sweep from; ``python -m fedsim.run.cli`` put the working folder first on the path,
    so each point ran the planted module as the user. The point here is refused by the real CLI
    before anything starts (exit 2)."""
    planted = tmp_path / "fedsim"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "cli.py").write_text(f"open({str(tmp_path / 'owned')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    sweep = Sweep(
        ["seed=0", "strategy=nope", f"results_dir={tmp_path / 'sweep'}"],
        lambda point: prepare(["seed=0"]),
    )
    assert sweep.run() == 1
    assert not (tmp_path / "owned").exists()
    assert "'nope' is not a strategy" in sweep.manifest["runs"][0]["error"]


# ---- a sweep record is input from someone else (issue 57) --------------------------------------


@cache
def _composed():
    """One point's checked config, for sweeps whose points these tests never compose."""
    return prepare(["seed=0"])


def _record(folder, overrides=("seed=0", "seed=1"), names=("seed-0", "seed-1"), extra=()) -> None:
    """A sweep record of FedTP points over seeds, completed (what records/ holds: the manifest,
    each point's point.json, config.yaml and results.json) unless its name is not the sweep's."""
    runs = []
    for seed, (override, name) in enumerate(zip(overrides, names)):
        point = folder / f"seed-{seed}"
        point.mkdir(parents=True)
        (point / "point.json").write_text(
            json.dumps({"overrides": [override, *extra], "swept": {"seed": str(seed)}})
        )
        (point / "config.yaml").write_text("{}\n")
        ehr = {
            r: {"overall": {"ehr": 0.5 + (r == "fedmix") * 0.01 * (seed + 1)}}
            for r in ("tfidf", "fedmix")
        }
        (point / "results.json").write_text(json.dumps({"routers": ehr}))
        runs.append(
            {
                "name": name,
                "overrides": [override, *extra],
                "seconds": 1.0,
                "status": "completed" if name == point.name else "pending",
            }
        )
    (folder / MANIFEST).write_text(json.dumps({"swept": ["seed"], "provenance": {}, "runs": runs}))


def test_a_sweep_record_holding_a_link_is_refused_before_it_is_read(tmp_path, victim_home, capsys):
    """The attack: a shared record whose every point is complete holds a dangling ``summary.md``
    link; ``fedsim run -m ... resume=<record>`` ran nothing and went on to the final comparison,
    which created ``~/.ssh/authorized_keys`` through it."""
    record = tmp_path / "record"
    _record(record)
    (record / "summary.md").symlink_to(victim_home / ".ssh" / "authorized_keys")
    assert cli.main(["run", "-m", "seed=0,1", f"resume={record}"]) == 2
    assert f"{str(record / 'summary.md')!r} is a link" in capsys.readouterr().err
    with pytest.raises(ValueError, match="summary.md' is a link"):
        Sweep(["seed=0,1", f"resume={record}"], lambda point: _composed()).run()
    assert not (victim_home / ".ssh" / "authorized_keys").exists()


@pytest.mark.parametrize("name", ["../../x", "/abs"])
def test_a_point_name_from_the_manifest_never_leads_outside_the_sweep_folder(name, tmp_path):
    """The attack: a record's ``sweep.json`` names a pending point ``../../x`` (or an absolute
    path): its ``point.json`` was written, and the point run, outside the sweep folder. A point's
    folder is named by the sweep from its overrides, and a manifest naming another is refused."""
    name = str(tmp_path / "abs") if name == "/abs" else name
    sweep = tmp_path / "a" / "sweep"
    _record(sweep, names=("seed-0", name), extra=["strategy=nope"])  # a point that would fail fast
    with pytest.raises(
        ConfigError, match=f"{MANIFEST} entry 2 names its folder {re.escape(repr(name))}"
    ):
        Sweep(["seed=0,1", "strategy=nope", f"resume={sweep}"], lambda point: _composed()).run()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_sweep_folder_others_can_write_is_refused_before_its_manifest_is_read(tmp_path):
    """The attack: another local user who can write the folder a sweep is in plants a link for
    its manifest (or swaps a point's files) before any check. Refused before the first read or
    write, for a new sweep and a resumed one."""
    shared = tmp_path / "shared"
    _record(shared / "sweep")
    (shared / "sweep" / MANIFEST).rename(tmp_path / "theirs.json")
    (shared / "sweep" / MANIFEST).symlink_to(tmp_path / "theirs.json")
    shared.chmod(0o777)
    for where in (f"resume={shared / 'sweep'}", f"results_dir={shared / 'new'}"):
        with pytest.raises(ConfigError, match=f"{shared} is writable by others"):
            Sweep(["seed=0,1", where], lambda point: _composed())
    assert sorted(p.name for p in shared.iterdir()) == ["sweep"]


def test_a_sweep_folder_named_through_a_folder_others_can_write_or_holding_one_is_refused(tmp_path):
    """The attack: ``resume=`` names the user's record through a link in a folder another user
    can write (they could repoint it after the check), or the record holds a point folder others
    can write (kept by ``tar -p``): either way its files could be swapped after the checks."""
    own, shared = tmp_path / "own", tmp_path / "shared"
    _record(own)
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "sweep").symlink_to(own)
    with pytest.raises(ConfigError, match=f"{shared} is writable by others"):
        Sweep(["seed=0,1", f"resume={shared / 'sweep'}"], lambda point: _composed())
    shared.chmod(0o755)
    (own / "seed-1").chmod(0o777)
    with pytest.raises(ConfigError, match=f"{own / 'seed-1'} is writable by others"):
        Sweep(["seed=0,1", f"resume={shared / 'sweep'}"], lambda point: _composed())


def test_a_manifest_that_is_no_sweeps_manifest_is_refused_naming_it(tmp_path):
    """The attack: a record's sweep.json nested past the recursion limit ended ``fedsim run -m
    ... resume=`` in a traceback; one over the size any fedsim file has was read whole."""
    _record(tmp_path / "sweep")
    (tmp_path / "sweep" / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(
        ValueError, match=f"{re.escape(repr(str(tmp_path / 'sweep' / MANIFEST)))} is not JSON"
    ):
        Sweep(["seed=0,1", f"resume={tmp_path / 'sweep'}"], lambda point: _composed())


def test_a_records_names_reach_the_terminal_escaped_from_a_resumed_sweeps_comparison(
    tmp_path, capsys
):
    """The attack: a completed record's metric name holding an ANSI escape reached the terminal
    in the final comparison's refusal (its list of methods, now the nearest paths to a metric
    pattern: a baseline that names no method is refused before the sweep runs) as it was."""
    narrowed = "sweep.metrics=[routers.nomethod.overall.ehr]"
    _record(tmp_path / "sweep", extra=[narrowed])
    results = tmp_path / "sweep" / "seed-1" / "results.json"
    routers = {
        **json.loads(results.read_text())["routers"],
        "\x1b]0;owned\x07": {"overall": {"ehr": 0.5}},
    }
    results.write_text(json.dumps({"routers": routers}))
    sweep = Sweep(["seed=0,1", narrowed, f"resume={tmp_path / 'sweep'}"], prepare)
    assert sweep.run() == 1
    err = capsys.readouterr().err
    assert "sweep comparison refused" in err and "\\x1b]0;owned\\x07" in err and "\x1b" not in err


@pytest.mark.parametrize("name", ["x${oc.env:SECRET_TOKEN}", "a,b"])
def test_a_sweep_folder_whose_name_hydra_reads_otherwise_is_refused(name, tmp_path, monkeypatch):
    """The attack: a record unpacked under its own name, ``x${oc.env:SECRET_TOKEN}``, resumed:
    each point is passed on as ``results_dir=<folder>/<point>``, which OmegaConf resolved, so the
    points ran in ``xhunter2/``, outside the sweep folder, with the token in their config.yaml
    for the record shared back. A folder Hydra does not read back as written is refused."""
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    _record(tmp_path / name)
    with pytest.raises(ConfigError, match="sweep folder .* Hydra"):
        Sweep(["seed=0,1", f"resume={tmp_path / name}"], lambda point: _composed())
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_failed_points_log_is_read_from_its_end_only(tmp_path):
    """The attack: a record's pending point carries a sparse fedsim.log of 10 GiB (nothing on
    disk); the point fails on resume (for any reason) and the sweep read the whole log into
    memory for the last 20 lines it keeps in the manifest. Only the log's end is read."""
    log = tmp_path / "fedsim.log"
    with open(log, "wb") as fh:
        fh.truncate(64 << 20)
    with open(log, "ab") as fh:
        fh.write(b"".join(b"line %d\n" % i for i in range(30)))
    tracemalloc.start()
    try:
        tail = _tail(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tail.splitlines() == [f"line {i}" for i in range(10, 30)] and peak < 1 << 20, peak


def test_a_records_mlflow_run_is_not_reopened_in_the_users_store(tmp_path):
    """The attack: a record's sweep.json names its MLflow run: an id not in the user's store ended
    the resume in a traceback; the id of the user's own earlier sweep (from a record they shared)
    was reopened, given this record's comparison and marked finished. Only a run made for this
    sweep folder is reopened; else the sweep gets a new one."""
    store = ["logging.mlflow=true", f"logging.mlflow_dir={tmp_path / 'mlflow'}"]
    earlier = SweepRun(tmp_path / "mlflow", "fedtp", tmp_path / "mine", None, {}, {})
    earlier.stop()
    for planted in (earlier.run_id, "0" * 32):
        record = tmp_path / f"record-{planted[:4]}"
        _record(record, extra=store)
        manifest = json.loads((record / MANIFEST).read_text())
        (record / MANIFEST).write_text(json.dumps({**manifest, "mlflow_run_id": planted}))
        sweep = Sweep(["seed=0,1", *store, f"resume={record}"], prepare)
        sweep.run()
        assert sweep.manifest["mlflow_run_id"] not in (planted, None)
        assert _mlflow_runs(tmp_path)[sweep.manifest["mlflow_run_id"]].info.status == "FINISHED"
    assert _mlflow_runs(tmp_path)[earlier.run_id].info.status == "KILLED"
    assert MlflowClient(store_uri(tmp_path / "mlflow")).list_artifacts(earlier.run_id) == []
    again = Sweep(
        ["seed=0,1", *store, f"resume={record}"], prepare
    )  # the sweep's own run is reopened
    again.run()
    assert again.manifest["mlflow_run_id"] == sweep.manifest["mlflow_run_id"]


@pytest.mark.parametrize(
    "change",
    [
        {"resumed": "x"},
        {
            "runs": [
                {"name": "seed-0", "overrides": ["seed=0"]},
                {"name": "seed-1", "overrides": ["seed=1"]},
            ]
        },
    ],
)
def test_a_manifest_of_another_shape_is_refused_before_the_sweep_resumes(change, tmp_path):
    """The attack: a record's sweep.json whose ``resumed`` is not a list, or whose points have no
    status, ended ``fedsim run -m ... resume=`` in a traceback (AttributeError, KeyError)."""
    _record(tmp_path / "sweep")
    manifest = json.loads((tmp_path / "sweep" / MANIFEST).read_text())
    (tmp_path / "sweep" / MANIFEST).write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ConfigError, match="is not a sweep's manifest"):
        Sweep(["seed=0,1", f"resume={tmp_path / 'sweep'}"], lambda point: _composed()).run()


def test_a_records_folder_names_reach_the_terminal_escaped_when_a_resume_is_refused(
    tmp_path, capsys
):
    """The attack: a record's folder named with an ANSI escape, refused (here: others can write
    it), was named in the configuration error as it was, to the terminal."""
    _record(tmp_path / "sweep")
    (tmp_path / "sweep" / "\x1b]0;owned\x07").mkdir(mode=0o777)
    (tmp_path / "sweep" / "\x1b]0;owned\x07").chmod(0o777)
    assert cli.main(["run", "-m", "seed=0,1", f"resume={tmp_path / 'sweep'}"]) == 2
    err = capsys.readouterr().err
    assert "\\x1b]0;owned\\x07 is writable by others" in err and "\x1b" not in err
