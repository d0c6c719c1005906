"""``fedsim run KEY=VALUE ...``: compose the config, check it, run it through Flower."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fedsim.config.compose import (
    CONF_DIR,
    GROUPS,
    REFUSED,
    RESUMABLE,
    ConfigError,
    about,
    choices,
    compose_checked,
    hydra_config,
    population,
)
from fedsim.config.schema import layout, protocol_of, sweep_settings, typed_sweep
from fedsim.flower.cli import (
    SimulationBackendConfig,
    SimulationClientResources,
    SimulationInitArgs,
    SuperLinkConnection,
    SuperLinkSimulationOptions,
    init_flwr_config,
    write_superlink_connection,
)
from fedsim.privacy.secret import Tampered, derive, open_sealed, private_folder, seal, user_secret
from fedsim.results import provenance
from fedsim.results.comparison import POINT_FILE, counted_runs, plan, read_config
from fedsim.results.comparison import build as build_comparison
from fedsim.results.comparison import write as write_comparison
from fedsim.results.mlflow_sink import annotate as annotate_mlflow
from fedsim.results.outputs import escape_controls, write_file
from fedsim.results.sinks import tensorboard_text
from fedsim.run.launcher import (
    Interrupted,
    RunFailed,
    check_private_network,
    check_ray_cluster,
    launch,
    user_certificates,
)
from fedsim.run.sweep import (
    Sweep,
    earlier_looks,
    read_manifest,
    record_look,
    recorded_methods,
    refuse_changed_plan,
    refuse_other_writers,
)
from fedsim.run.tls import make_federation

RUN_FILE = Path("checkpoint") / "run.json"
RUN_KEY = "resume.key"  # this user's secret that seals run.json (fedsim.privacy.secret.user_secret)
# `flwr run . NAME` -> the hardware profile its simulation is sized from (fedsim federations)
FEDERATIONS = {"local-simulation": "cpu_2", "gpu-simulation": "gpu_1"}


def resumed(folder: str, overrides: list[str]) -> list[str]:
    """The killed run's overrides, then ``overrides`` (only keys that cannot change the
    experiment: where it runs, timeouts, the data's location, sinks), then ``resume=true``."""
    saved = Path(folder).expanduser().resolve() / RUN_FILE
    if not saved.is_file():
        raise ConfigError(f"resume: {saved} not found (no checkpointed run in {folder})")
    if (saved.parent.parent / "results.json").exists():
        raise ConfigError(f"resume: the run in {folder} completed; nothing to resume")
    for item in overrides:
        key = item.partition("=")[0].lstrip("+~")
        if key.split(".")[0] not in RESUMABLE:
            raise ConfigError(
                f"resume: '{item}' would change the experiment; a resume may only "
                f"change {', '.join(RESUMABLE)}"
            )
    folder = saved.parent.parent
    try:
        key = run_file_key(folder)
    except OSError as exc:  # this user's key folder open to others
        raise ConfigError(f"resume: {exc}") from exc
    try:
        pinned = open_sealed(key, saved)["overrides"]
    except (Tampered, KeyError, TypeError) as exc:
        raise ConfigError(
            f"resume: {saved} was not written here by `fedsim run` for this user: a run resumes "
            f"only in the folder it was started in, by the user who started it (not a copy, e.g. "
            f"a point of a shared sweep record, nor a moved folder, nor a checkpoint of an earlier "
            f"fedsim, which kept its key in the folder); remove {folder / 'checkpoint'} to run it "
            f"from its beginning"
        ) from exc
    return [*pinned, *overrides, "resume=true"]


def _resume_folder(overrides: list[str]) -> tuple[str | None, list[str]]:
    folders = [o.partition("=")[2] for o in overrides if o.startswith("resume=")]
    rest = [o for o in overrides if not o.startswith("resume=")]
    return (folders[-1] if folders else None), rest


def run_file_key(folder: Path) -> bytes:
    """The key that seals run.json in the run folder ``folder``: a resume runs its overrides (any
    ``_target_``), so only a run this user started in this very folder may resume. Derived from
    this user's own secret, outside every results folder (a folder copied from elsewhere carries
    none), and bound to the folder's path and inode (a copy, a move, a folder put in its place
    are other places; not its device, which a remount may renumber)."""
    folder = folder.resolve()
    return derive(
        user_secret(RUN_KEY), b"run.json\0" + os.fsencode(folder) + b"\0%d" % folder.stat().st_ino
    )


def _save_run(cfg, pinned: list[str]) -> None:
    if cfg.checkpoint.enabled and not cfg.resume:
        path = Path(cfg.results_dir) / RUN_FILE
        try:
            private_folder(path.parent)
            key = run_file_key(Path(cfg.results_dir))
        except (
            OSError
        ) as exc:  # this user's key folder open to others: refused before anything starts
            raise ConfigError(f"checkpoint: {exc}") from exc
        write_file(
            path, seal(key, path.name, {"overrides": pinned})
        )  # a record's folder may hold a link there


def prepare(overrides: list[str]) -> tuple[DictConfig, list[str], int, int]:
    """Compose and check a run before any process starts: the config, the overrides after a
    resume's, and the layout (logical clients, SuperNodes). Raises :data:`REFUSED` errors."""
    folder, overrides = _resume_folder(overrides)
    if folder:
        overrides = resumed(folder, overrides)
    cfg = compose_checked(
        overrides
    )  # bad strategy or wrapper values fail here, before any process starts
    natural = 0 if cfg.hardware.num_clients or cfg.hardware.num_supernodes else population(cfg)
    clients, nodes = layout(cfg.hardware, natural)
    if (
        natural
    ):  # the protocol's rules that need the number of clients (checked above when it was given)
        protocol_of(cfg).check_run(cfg, clients)
    user_certificates(cfg.hardware, nodes)  # missing certificate files: refused here
    check_private_network(cfg.hardware)  # no network namespace for this user: refused here
    check_ray_cluster(cfg.hardware)  # no Ray cluster at hardware.ray_address: refused here
    return cfg, overrides, clients, nodes


def show(overrides: list[str], part: str) -> int:
    """``fedsim run --cfg job|hydra|all``: the config a run would use, composed and checked, as
    YAML (``job``), Hydra's own node (``hydra``: its search path, the chosen options, the
    overrides), or both (``all``); nothing starts (Hydra's own flag, for a reader checking what
    an override does)."""
    try:
        cfg, overrides = prepare(overrides)[:2]
    except REFUSED as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    shown = {
        "job": cfg,
        "hydra": {"hydra": hydra_config(overrides)},
        "all": {"hydra": hydra_config(overrides), **OmegaConf.to_container(cfg, resolve=True)},
    }[part]
    print(OmegaConf.to_yaml(shown, resolve=part == "job"), end="")
    return 0


def info(overrides: list[str]) -> int:
    """``fedsim run --info``: as Hydra's ``--info``, where the config comes from (the search
    path), which option of each group the overrides choose, and the overrides; nothing starts."""
    try:
        hydra = hydra_config(prepare(overrides)[1])
    except REFUSED as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    sources = [f"  {s.provider}: {s.schema}://{s.path}" for s in hydra.runtime.config_sources]
    chosen = [
        f"  {group}: {option}"
        for group, option in hydra.runtime.choices.items()
        if not group.startswith("hydra/")
    ]
    print(
        "\n".join(
            [
                versions(),
                "Config search path:",
                *sources,
                "Chosen options (group: option):",
                *chosen,
                "Overrides:",
                *(f"  {o}" for o in hydra.overrides.task),
            ]
        )
    )
    return 0


def versions() -> str:
    """fedsim's version and the versions of the two frameworks it runs on."""
    from importlib.metadata import version

    return f"fedsim {version('fedsim')} (Flower {version('flwr')}, Hydra {version('hydra-core')})"


def groups_help() -> str:
    """The config groups and their options, as Hydra's ``--help`` lists them."""
    groups = [*GROUPS[:1], "task/selector", *GROUPS[1:]]
    return (
        "config groups (pick one with GROUP=OPTION; keys in conf/, docs/usage.md; "
        "`fedsim experiments` says what each experiment shows and costs):\n"
        + "\n".join(f"  {g}: {', '.join(choices(g))}" for g in groups)
    )


def experiments() -> int:
    """``fedsim experiments``: every experiment, one line of what it shows, and the wall time of
    one run on 2 CPU cores where one was measured (its YAML's ``about``, with where)."""
    try:
        rows = [(name, about(name)) for name in choices("experiment")]
    except ConfigError as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    width = max(len(name) for name, _ in rows)
    for name, stated in rows:
        print(f"{name:<{width}}  {stated.shows} [{run_time(stated)}]")
    print(
        "\nrun one: fedsim run experiment=NAME (its config: fedsim run --cfg job experiment=NAME)"
    )
    return 0


def run_time(stated) -> str:
    """An experiment's measured time as ``fedsim experiments`` prints it."""
    if stated.seconds is None:
        return "not measured"
    minutes = f"{stated.seconds / 60:.0f} min" if stated.seconds >= 120 else None
    return f"{minutes or f'{stated.seconds:.0f} s'} a run on 2 cores, measured: {stated.measured}"


def run(overrides: list[str]) -> int:
    given, started, git = list(overrides), provenance.now(), provenance.git_state()
    try:
        cfg, overrides, clients, nodes = prepare(overrides)
        # the ServerApp composes again from the same overrides: pin what was resolved here (a remote
        # ServerApp finds its data by its own host's data root and ships its results back)
        remote = cfg.hardware.backend == "deployment" and not cfg.hardware.launch_local
        pinned = [
            *overrides,
            *([] if remote or cfg.data_root is None else [f"data_root={cfg.data_root}"]),
            f"results_dir={cfg.results_dir}",
            f"logging.mlflow_dir={cfg.logging.mlflow_dir}",
            f"hardware.num_clients={clients}",
        ]
        _save_run(cfg, [o for o in pinned if o != "resume=true"])
    except REFUSED as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    try:
        outcome = launch(cfg, pinned, nodes)
    except RunFailed as exc:
        print(f"fedsim: run failed:\n{exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print("fedsim: interrupted; nothing left running", file=sys.stderr)
        return exc.exit_code
    record_provenance(
        cfg,
        Path(outcome["results_dir"]),
        {
            "git": git,
            "command": {
                **provenance.command(["fedsim", "run", *given], pinned),
                "started": started,
                "ended": provenance.now(),
            },
        },
    )
    if (
        not cfg.checkpoint.keep
    ):  # a completed run is never resumed: its journal is megabytes of nothing
        shutil.rmtree(Path(outcome["results_dir"]) / RUN_FILE.parent, ignore_errors=True)
    print(
        f"fedsim: run {outcome['run_id']} {outcome['status']}; results in {outcome['results_dir']}"
    )
    return 0


def federations(overrides: list[str]) -> int:
    """``fedsim federations [OVERRIDES]``: Flower's named connections ``local-simulation`` and
    ``gpu-simulation`` (:data:`FEDERATIONS`) in ``$FLWR_HOME/config.toml``, each Flower's local
    SuperLink sized as ``fedsim run`` sizes the run of ``OVERRIDES`` on that hardware profile (one
    SuperNode per client, the profile's CPUs and GPU shares), written by Flower's own writer.
    Not in pyproject.toml: Flower 1.42 reads named connections only from its config file, and
    migrates a ``[tool.flwr.federations]`` table there by rewriting pyproject.toml."""
    try:
        sized = {
            name: prepare([*overrides, f"hardware={profile}"])
            for name, profile in FEDERATIONS.items()
        }
    except REFUSED as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    init_flwr_config()
    for name, (cfg, _, clients, nodes) in sized.items():
        hw = cfg.hardware
        backend = SimulationBackendConfig(
            client_resources=SimulationClientResources(
                num_cpus=int(hw.client_cpus), num_gpus=float(hw.client_gpus)
            ),
            init_args=SimulationInitArgs(num_cpus=int(hw.num_cpus)),
        )
        write_superlink_connection(
            SuperLinkConnection(
                name,
                address=":local:",
                options=SuperLinkSimulationOptions(num_supernodes=nodes, backend=backend),
            )
        )
        print(
            f"fedsim: `flwr run . {name}`: {nodes} SuperNodes for {clients} clients, "
            f"hardware={FEDERATIONS[name]} ({hw.client_cpus} CPU, {hw.client_gpus} GPU per ClientApp)"
        )
    return 0


def record_provenance(cfg, results_dir: Path, part: dict) -> None:
    """What only this process knows (the checkout's commit, the command) joins the ServerApp's
    provenance in results.json and summary.md, and goes to the run's MLflow run (source tags,
    the two files again) and TensorBoard log (a text)."""
    merged = provenance.stamp(results_dir, part)
    if cfg.logging.mlflow:
        annotate_mlflow(
            results_dir, merged, [results_dir / "results.json", results_dir / "summary.md"]
        )
    if cfg.logging.tensorboard:
        tensorboard_text(results_dir, "provenance", provenance.section(merged))


def multirun(overrides: list[str]) -> int:
    try:
        sweep = Sweep(overrides, prepare)
    except REFUSED as exc:  # may name a record's folders and files: escaped for the terminal
        print(escape_controls(f"fedsim: configuration error:\n{exc}", keep="\n"), file=sys.stderr)
        return 2
    return sweep.run()


def _sweep_setting_warnings(
    stated: dict[str, DictConfig], defaults, chosen: DictConfig
) -> list[str]:
    """A sweep resumed across commits holds runs whose configs state other sweep settings (an
    effect of interest narrowed, say): the comparison uses the first run's, so name every key
    whose setting in effect (a run's ``stated`` block over ``defaults``) another run holds
    otherwise and the command line (``chosen``) does not set."""
    in_effect = {
        run: OmegaConf.to_container(sweep_settings(defaults, block))
        for run, block in stated.items()
    }
    (first_run, first), *others = in_effect.items()
    differ: dict[str, list[str]] = {}
    for run, other in others:
        for key in (k for k in first if other[k] != first[k] and k not in chosen):
            differ.setdefault(key, []).append(run)
    return [
        f"sweep.{key} differs in {', '.join(runs)} from {first_run}'s, which this comparison uses "
        f"(set sweep.{key} to choose)"
        for key, runs in differ.items()
    ]


def compare(
    folder: str,
    overrides: list[str],
    output: str | None = None,
    force: bool = False,
    pilot: bool = False,
) -> int:
    """The sweep settings of the first run under ``folder`` that a comparison counts (its resolved
    config.yaml, so the data is not needed; a key it lacks keeps ``conf/config.yaml``'s value),
    then ``overrides``, applied to every run found there; a warning names each setting another
    run states otherwise. ``pilot``: print the seeds each paired difference needs (``--plan``)
    and write nothing."""
    try:
        if any(not o.startswith("sweep.") for o in overrides):
            raise ConfigError(f"compare takes sweep.* overrides only, got {overrides}")
        output = refuse_other_writers(output or folder, "output folder")
        folder = refuse_other_writers(
            folder, "record", inside=True
        )  # resolved: the path checked is the one used
        configs = {
            str(run.relative_to(folder)): read_config(run / "config.yaml")
            for run in counted_runs(folder)
            if (run / "config.yaml").is_file()
        }
        stated = {run: config.get("sweep", {}) for run, config in configs.items()}
        if not stated:
            raise ConfigError(
                f"no completed sweep run (a {POINT_FILE} beside a results.json and a config.yaml, "
                f"no error.txt) under {folder}"
            )
        defaults = OmegaConf.load(CONF_DIR / "config.yaml").sweep
        sweep_overrides = OmegaConf.from_dotlist([o.removeprefix("sweep.") for o in overrides])
        sweep = sweep_settings(defaults, next(iter(stated.values())), sweep_overrides)
        for warning in _sweep_setting_warnings(stated, defaults, sweep_overrides):
            print(escape_controls(f"fedsim: compare: warning: {warning}"), file=sys.stderr)
        metrics_given = any(
            o.startswith("sweep.metrics=") for o in overrides
        )  # the user's patterns must match
        settings = typed_sweep(sweep)
        methods = recorded_methods(next(iter(configs.values())))
        if manifest := read_manifest(folder):
            refuse_changed_plan(*manifest, settings.planned())
        if pilot:
            print(plan(build_comparison(folder, settings, metrics_given, methods=methods)), end="")
            return 0
        looks = earlier_looks(manifest[1]) if manifest else ()
        result, written = write_comparison(
            folder, settings, output, force, metrics_given, looks, methods
        )
        if manifest:  # a look at the record counts wherever its outputs go
            record_look(*manifest, result)
    except REFUSED as exc:
        print(escape_controls(f"fedsim: compare: {exc}", keep="\n"), file=sys.stderr)
        return 2
    for warning in result["warnings"]:
        print(escape_controls(f"fedsim: compare: warning: {warning}"), file=sys.stderr)
    print(
        escape_controls(
            f"fedsim: comparison in {written[0].parent}: {', '.join(p.name for p in written)}"
            f"{'' if written[0].name == 'summary.md' else ' (an earlier comparison is there; --force replaces it)'}"
        )
    )
    return 0


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Overrides may follow a flag (``fedsim compare FOLDER --plan KEY=V``), as in Hydra's own
    apps: argparse matches a subcommand's positionals in one go before the first flag and refuses
    what comes after; ``parse_intermixed_args``, argparse's answer, does not take subparsers."""
    args, extra = parser.parse_known_args(argv)
    if extra and (any(e.startswith("-") for e in extra) or not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedsim", description=__doc__)
    parser.add_argument("--version", action="version", version=versions())
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser(
        "run",
        help="run an experiment: fedsim run experiment=fedtp_paper ...",
        epilog=groups_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_p.add_argument("overrides", nargs="*", help="Hydra overrides KEY=VALUE")
    run_p.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="sweep: KEY=a,b / KEY=range(0,5) run the cartesian product into one folder "
        "(resume=<sweep folder> re-runs what did not complete)",
    )
    run_p.add_argument(
        "--cfg",
        choices=["job", "hydra", "all"],
        help="print the composed, checked config (job), Hydra's node (hydra) or both, and exit",
    )
    run_p.add_argument(
        "--info",
        action="store_true",
        help="print the config search path, each group's chosen option and the overrides, and exit",
    )
    cmp_p = sub.add_parser(
        "compare",
        help="rebuild a sweep's comparison (summary.md, comparison.json) from its run folders",
    )
    cmp_p.add_argument("folder", help="a sweep folder, or any folder holding sweep runs")
    cmp_p.add_argument("overrides", nargs="*", help="sweep.* overrides, e.g. sweep.baseline=fedbis")
    cmp_p.add_argument("--output", help="where to write it (default: the folder itself)")
    cmp_p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier comparison there (default: write summary-2.md, ... beside it)",
    )
    cmp_p.add_argument(
        "--plan",
        action="store_true",
        help="from a pilot sweep: print the seeds each paired difference needs; write nothing",
    )
    certs_p = sub.add_parser(
        "certs",
        help="make a private CA, a SuperLink certificate and SuperNode keys for a test federation",
    )
    certs_p.add_argument(
        "folder", help="where to write ca.pem, superlink.pem/.key, node-I.key/.pub"
    )
    certs_p.add_argument(
        "--hosts",
        default="127.0.0.1,localhost",
        help="comma-separated names / IPs the SuperLink is reached by",
    )
    certs_p.add_argument("--nodes", type=int, default=2, help="SuperNode key pairs to make")
    sub.add_parser(
        "experiments",
        help="list the experiments: what each shows and its measured time on 2 CPU cores",
    )
    fed_p = sub.add_parser(
        "federations",
        help="write Flower's named connections local-simulation and "
        "gpu-simulation (flwr run . NAME), sized for the overrides' run",
    )
    fed_p.add_argument(
        "overrides", nargs="*", help="Hydra overrides KEY=VALUE of the run to size for"
    )
    args = _parse(parser, argv)
    if args.command == "experiments":
        return experiments()
    if args.command == "federations":
        return federations(args.overrides)
    if args.command == "certs":
        certs = make_federation(args.folder, args.hosts.split(","), args.nodes)
        print(
            f"fedsim: CA {certs.ca}, SuperLink certificate for {args.hosts}, "
            f"{args.nodes} SuperNode keys in {certs.folder}"
        )
        return 0
    if args.command == "compare":
        return compare(args.folder, args.overrides, args.output, args.force, args.plan)
    if (args.cfg or args.info) and args.multirun:
        parser.error(
            "--cfg and --info show one run's config; give one point's overrides without -m"
        )
    if args.info:
        return info(args.overrides)
    if args.cfg:
        return show(args.overrides, args.cfg)
    return multirun(args.overrides) if args.multirun else run(args.overrides)


if __name__ == "__main__":
    sys.exit(main())
