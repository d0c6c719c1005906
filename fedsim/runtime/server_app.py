"""The one ServerApp: compose the Hydra config named by the run config and run its protocol.

With ``ship_results`` (a run on a remote SuperLink) the outputs are written to a temporary
folder and printed into the run's log, from which ``fedsim run`` unpacks them locally.

The run config (``[tool.flwr.app.config]`` of pyproject.toml) holds Hydra overrides, one path
into the same config as ``fedsim run``: the typed keys of :data:`RUN_CONFIG_KEYS`
(``flwr run . --run-config "experiment='fedtp_paper' seed=3"``), each the override it names, and
``overrides``, any overrides as one string (``fedsim run`` passes its own that way). They are
composed and checked as ``fedsim run`` checks them before the first message is sent; a refusal
is logged as fedsim's message (the valid choices, the nearest key). The protocol sends every
phase through one :class:`~fedsim.runtime.messaging.Messenger`, whose fault counts and traffic go into
every ``results.json`` (``faults``, ``communication``), also when the protocol fails.
The process's random state and Flower's node sampling are seeded from the run's seed before
the protocol starts (``fedsim/seeding.py``), and the Messenger learns every node's partition,
so that the same seed samples, sends and sums in the same order in every run.
"""

from __future__ import annotations

import logging
import os
import random
import shlex
import shutil
import tempfile
import traceback
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp
from omegaconf import DictConfig

from fedsim.clock.schedule import VirtualClock
from fedsim.code_policy import allowed_code
from fedsim.config.compose import (
    REFUSED,
    compose_checked,
    experiment_digest,
    hydra_config,
    population,
)
from fedsim.config.data import DataNotFoundError
from fedsim.config.schema import typed_sweep
from fedsim.flower.strategies import strategy_utils
from fedsim.message_keys import CONFIG
from fedsim.privacy.audit import BOUND_COLUMNS, AuditReport
from fedsim.privacy.audit import METHOD as AUDIT_METHOD
from fedsim.privacy.dp import NOT_PRIVATE
from fedsim.privacy.plan import PrivacyPlan
from fedsim.privacy.secret import derive, run_secret
from fedsim.progress import Quiet
from fedsim.results import provenance
from fedsim.results.comparison import headline, lead_with, run_headline
from fedsim.results.curves import learning_curve
from fedsim.results.mlflow_sink import MlflowSink
from fedsim.results.outputs import RunOutput, markdown_table, ship_results
from fedsim.results.sinks import Sinks
from fedsim.runtime import flwr_cli
from fedsim.runtime.client_state import FORGET, RUN_KEY, STATE_KEY, forget_request
from fedsim.runtime.flower_waits import shorten_pull_backoff
from fedsim.runtime.journal import Journal
from fedsim.runtime.messaging import ANY, Messenger, PhaseFailed, Policy, client_config
from fedsim.runtime.reply_pull import isolate_reply_pulls
from fedsim.runtime.sharded_grid import ShardedGrid
from fedsim.seeding import SERVER, SERVER_SAMPLING, reseed

app = ServerApp()
QUIET = Quiet()

# [tool.flwr.app.config]'s keys for the common knobs -> the Hydra override each one sets ("" leaves
# it to conf/); tests/test_docs.py checks that pyproject.toml declares exactly these and `overrides`
RUN_CONFIG_KEYS = {
    "experiment": "experiment",
    "hardware": "hardware",
    "strategy": "strategy",
    "privacy": "privacy",
    "num-server-rounds": "num_rounds",
    "seed": "seed",
}


@app.main()
def main(grid: Grid, context: Context) -> None:
    logger = logging.getLogger("fedsim")
    if not logger.handlers:  # Flower's own handlers stay as they are
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s fedsim: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    overrides = run_overrides(context.run_config)
    by_flwr = flwr_cli.started_by_flwr_cli()
    try:
        cfg = compose_checked(overrides)
        if by_flwr and cfg.hardware.backend == "simulation":
            flwr_cli.refuse_settings_clients_miss(overrides, cfg)
    except REFUSED as exc:  # Flower marks the run failed and logs the traceback after this
        note = f"\n{flwr_cli.superlink_note()}" if isinstance(exc, DataNotFoundError) else ""
        logger.error("configuration error, nothing was sent:\n%s%s", exc, note if by_flwr else "")
        if by_flwr:
            logger.error(flwr_cli.failure_note(context.run_id))
        raise
    flower_log = logging.getLogger("flwr")
    if cfg.logging.level == "debug":
        flower_log.removeFilter(QUIET)
    else:
        flower_log.addFilter(QUIET)  # once: a filter added again is not added twice
    if (
        by_flwr and not cfg.ship_results
    ):  # `fedsim run` keeps the log it streams (fedsim/run/launcher.py)
        keep_log(Path(cfg.results_dir) / "fedsim.log", [logger, flower_log])
    if cfg.hardware.backend == "deployment" and cfg.hardware.waits.pull_backoff is not None:
        shorten_pull_backoff(
            cfg.hardware.waits.pull_backoff
        )  # replies are pulled from the SuperLink
    # what `fedsim run` adds where it runs (fedsim/run/cli.py), the ServerApp adds under `flwr run`
    origin = (
        {
            "git": flwr_cli.checkout(),
            "command": flwr_cli.command(context.run_id, context.run_config),
        }
        if by_flwr
        else {}
    )
    try:
        if cfg.ship_results:  # a remote SuperLink: results go back in the log, not the user's path
            with tempfile.TemporaryDirectory(prefix="fedsim-results-") as folder:
                try:
                    _run(grid, cfg, RunOutput(folder), overrides, origin)
                finally:
                    print("\n".join(ship_results(Path(folder))), flush=True)
        else:
            _run(grid, cfg, RunOutput(cfg.results_dir), overrides, origin)
    except BaseException:
        if by_flwr:
            logger.error(flwr_cli.failure_note(context.run_id))
        raise
    if by_flwr and not (cfg.checkpoint.keep or cfg.ship_results):  # as `fedsim run` does
        shutil.rmtree(Path(cfg.results_dir) / "checkpoint", ignore_errors=True)


def keep_log(path: Path, loggers: list[logging.Logger]) -> None:
    """Every later record of ``loggers`` also to ``path`` (appended to), never through a link
    planted there (as ``fedsim run``'s log, fedsim/run/launcher.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1, encoding="utf-8"))
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for log in loggers:
        log.addHandler(handler)


def run_overrides(run_config) -> list[str]:
    """The Hydra overrides Flower's run config carries: each typed key that is set, then the
    ``overrides`` string. Values go to Hydra as written, so its typed schema checks them
    (``seed='x'``: could not be converted to Integer), not Flower, which checks only names."""
    typed = [
        f"{override}={run_config[key]}"
        for key, override in RUN_CONFIG_KEYS.items()
        if run_config.get(key, "") != ""
    ]
    return typed + shlex.split(str(run_config.get("overrides", "")))


def state_layout(grid: Grid, cfg) -> None:
    """Say how the task's clients sit on the SuperNodes connected at start, and pin their number
    (``hardware.num_clients``) as ``fedsim run`` does: under ``flwr run`` the federation's size is
    Flower's (2 SuperNodes unless ``--federation-config "num-supernodes=N"``), and fewer
    SuperNodes than clients make each SuperNode answer for several clients in one reply."""
    log = logging.getLogger("fedsim")
    nodes = len(list(grid.get_node_ids()))
    clients = int(cfg.hardware.num_clients or population(cfg))
    cfg.hardware.num_clients = clients
    per = int(cfg.hardware.clients_per_supernode)
    if per > 1:
        log.info(
            "%d SuperNodes connected, %d logical clients (up to %d per SuperNode), one reply per client",
            nodes,
            clients,
            per,
        )
    elif nodes < clients:
        log.warning(
            "%d SuperNodes connected for the task's %d clients: each SuperNode hosts about %d of them and "
            "answers for them in one reply; for one client per SuperNode use "
            "--federation-config \"num-supernodes=%d\" (or fedsim run, which sizes it)",
            nodes,
            clients,
            -(-clients // max(nodes, 1)),
            clients,
        )
    else:
        log.info(
            "%d SuperNodes connected for %d clients, one client per SuperNode%s",
            nodes,
            clients,
            " (the extra SuperNodes resample clients)" if nodes > clients else "",
        )


def config_from_run(run_config) -> DictConfig:
    """The run's config from Flower's run config, with ``fedsim run``'s checks: a wrong key,
    type, strategy or wrapper fails here, before any client works."""
    return compose_checked(run_overrides(run_config))


def _forget_client_state(messenger: Messenger, cfg) -> None:
    """The run completed: every node removes the run's client state (unless
    ``client_state.keep``). A node that does not answer keeps it, which loses no result. Not
    journaled: a completed run is never resumed."""
    messenger.journal = None
    config = ConfigRecord(
        {k: v for k, v in client_config(cfg).items() if k in (RUN_KEY, STATE_KEY)}
    )
    nodes = messenger.node_ids()
    if isinstance(messenger.raw, ShardedGrid) and messenger.raw.reply_rows:
        nodes = messenger.raw.one_per_supernode(nodes)  # the state is per run and machine
    messages = [
        Message(
            RecordDict({CONFIG: config, FORGET: forget_request(str(config[RUN_KEY]))}),
            dst_node_id=n,
            message_type=MessageType.QUERY,
        )
        for n in nodes
    ]
    try:
        messenger.exchange("forget", messages, Policy(ANY))
    except PhaseFailed as exc:
        logging.getLogger("fedsim").warning("client state not removed: %s", exc)


def _run(
    grid: Grid, cfg, out: RunOutput, overrides: list[str] = (), origin: dict | None = None
) -> None:
    log = logging.getLogger("fedsim")
    started = provenance.now()
    out.clear_outcome()
    keep = cfg.checkpoint.enabled and not cfg.ship_results  # a remote run's folder is temporary
    checkpoint = out.path / "checkpoint"
    # a run killed before its journal began (before this point, or before the ServerApp started)
    # sent nothing: resumed, it starts from its beginning, under a new secret
    resume = bool(cfg.resume) and keep and Journal.begun(checkpoint / "journal")
    if cfg.resume and not resume:
        log.info("resume: the killed run had journaled nothing; it starts from its beginning")
    secret = run_secret(checkpoint / "run.key" if keep else None, resume)
    # the clients' state folders: new for a fresh run (an earlier run in this results folder may
    # have left its own), the same when resumed (fedsim/runtime/client_state.py)
    cfg.client_state.run_key = derive(secret, b"client-state").hex()[:16]
    out.write_config(cfg, overrides, hydra_config(overrides))
    log.info("results -> %s", out.path)
    journal = (
        Journal(checkpoint / "journal", resume, derive(secret, b"journal"), experiment_digest(cfg))
        if keep
        else None
    )
    if journal is not None and journal.resumed_from:
        log.info("resume: replaying %d journaled exchanges", journal.resumed_from)
    plan = PrivacyPlan.build(
        cfg, secret
    )  # the run's privacy: noise, accounts, HE (fedsim/privacy/plan.py)
    sinks = Sinks(
        out.path,
        cfg.logging.csv,
        cfg.logging.tensorboard,
        MlflowSink.for_run(cfg) if cfg.logging.mlflow else None,
    )
    messenger, failed = None, True
    try:
        grid = isolate_reply_pulls(grid)
        state_layout(grid, cfg)
        if cfg.hardware.clients_per_supernode > 1:  # the protocol sees one node per logical client
            grid = ShardedGrid(
                grid,
                int(cfg.hardware.num_clients),
                float(cfg.round_timeout),
                reply_rows=cfg.hardware.client_backend == "batched",
                # a local simulation's SuperNodes share one machine: any can serve any client
                balance=cfg.hardware.client_backend == "batched"
                and cfg.hardware.backend == "simulation"
                and cfg.hardware.ray_address is None,
            )
        messenger = Messenger(
            grid,
            float(cfg.round_timeout),
            journal=journal,
            sinks=sinks,
            ledgers=[plan.dp_sgd.record],
            know_partitions=True,
        )
        messenger.clock = VirtualClock.of(cfg.clock, int(cfg.hardware.num_clients), int(cfg.seed))
        seed_server(int(cfg.seed))
        results, summary = allowed_code(cfg.protocol.run, "protocol.run")(messenger, cfg, out, plan)
        audit: AuditReport | None = results.pop("audit", None)
        results["privacy"] = plan.report()
        if "central_dp" in results["privacy"]:
            summary = (
                f"{summary.rstrip()}\n\n{central_dp_section(results['privacy']['central_dp'])}\n"
            )
        if audit:
            results["privacy"]["audit"] = audit.as_dict()
            summary = f"{summary.rstrip()}\n\n{audit_section(audit, out)}\n"
        summary = summary if plan.noise.private else f"**Warning: {NOT_PRIVATE}.**\n\n{summary}"
        # traffic per phase and round, beside any per-method summary the protocol made
        results.update(
            faults=messenger.faults,
            communication={**messenger.traffic, **results.get("communication", {})},
        )
        summary = lead_with(summary, run_headline(results, typed_sweep(cfg.sweep)))
        if learning_curve(results, out, str(cfg.protocol.name)) is not None:
            summary = (
                f"{summary.rstrip()}\n\nLearning curve (metric per round): `learning_curve.png`.\n"
            )
        summary = f"{summary.rstrip()}\n\n{faults_section(messenger.faults)}\n"
        if messenger.clock is not None:
            results["clock"] = messenger.clock.report()
            summary = f"{summary.rstrip()}\n\n{clock_section(results['clock'])}\n"
        if journal is not None:
            results["checkpoint"] = {
                "exchanges": len(journal.recorded),
                "replayed": journal.resumed_from,
            }
        results["provenance"] = {
            **provenance.environment(),
            "started": started,
            "ended": provenance.now(),
            **({"ray_nodes": messenger.ray_nodes} if messenger.ray_nodes else {}),
            **(origin or {}),
        }
        body, summary = (
            summary,
            f"{summary.rstrip()}\n\n{provenance.section(results['provenance'])}\n",
        )
        out.write_results(results, summary)
        sinks.finish(
            headline(results, typed_sweep(cfg.sweep)),
            int(cfg.num_rounds),
            (out.path / "config.yaml").read_text(),
            summary,
            out.files(),
        )
        # the terminal gets no provenance: the launcher stamps the commit and command into
        # summary.md after the run, so a section printed here would read "(no git checkout)"
        print(f"{body.rstrip()}\n\nProvenance: summary.md\n", flush=True)
        _forget_client_state(messenger, cfg)
        if audit:
            audit.enforce()  # a measured epsilon above the reported one fails the run, results written
        failed = False
    except BaseException:
        faults = messenger.faults if messenger else {}
        out.write_error(traceback.format_exc() + f"\nfaults so far: {faults}\n")
        raise
    finally:
        sinks.close(failed)


def faults_section(faults: dict) -> str:
    """The summary's table of what every exchange got back: one row per phase and round."""
    rows = [
        {"phase": phase, "round": rnd, **counts}
        for phase, rounds in faults.items()
        for rnd, counts in rounds.items()
    ]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return "## Appendix: replies per exchange\n\n" + (
        markdown_table(rows, columns) if rows else "(no exchange)"
    )


def clock_section(clock: dict) -> str:
    """The summary's virtual schedule: one row per round (or asynchronous server step)."""
    rows = [
        {
            k: r[k]
            for k in (
                "phase",
                "round",
                "virtual_start",
                "virtual_end",
                "accepted",
                "stragglers",
                "dropouts",
            )
        }
        for r in clock["rounds"]
    ]
    return (
        f"## Virtual clock\n\n{clock['virtual_seconds']:.1f} virtual seconds in all; "
        f"{clock['stragglers']} stragglers, {clock['dropouts']} dropouts (deadline "
        f"{clock['deadline']}, over-selection {clock['over_selection']:g}).\n\n"
        + markdown_table(rows, list(rows[0]) if rows else ["phase"], digits=1)
    )


def central_dp_section(spent: dict) -> str:
    """The summary's account of a Flower DP wrapper's run: the run's (epsilon, delta), each
    phase's, and the assumptions they rest on, where a reader of the table sees them."""
    rows = [{"phase": phase, **p} for phase, p in spent["phases"].items()]
    return "\n\n".join(
        [
            "## Privacy spent (central DP)",
            f"(epsilon, delta) = ({spent['epsilon']:.3f}, {spent['delta']:g}) for the whole run "
            f"(RDP {spent['epsilon_rdp']:.3f}, PLD {spent['epsilon_pld']:.3f}): "
            f"{spent['rounds']} rounds of {spent['mechanism']} at noise multiplier "
            f"{spent['noise_multiplier']:.4g} ({spent['epsilon_per_round']:.3f} per round), every phase "
            "composed. Per phase (one model each):",
            markdown_table(
                rows, ["phase", "rounds", "epsilon", "epsilon_rdp", "epsilon_pld"], digits=3
            ),
            f"Accountant: {spent['accountant']}. Amplification by sampling: {spent['amplification_by_sampling']}. "
            f"Covers: {spent['covers']}.",
        ]
    )


def audit_section(audit: AuditReport, out: RunOutput) -> str:
    """The summary's audit: each release's accountant epsilon beside the measured lower bound,
    and ``privacy_audit.png``, both against sigma."""
    fig, ax, save = out.figure("privacy_audit")
    audit.plot(ax)
    ax.set_title("Privacy audit: the accountant's epsilon, the measured bound", fontsize=10)
    save()
    return "\n\n".join(
        [
            "## Privacy audit: measured lower bound beside the accountant's epsilon",
            f"{AUDIT_METHOD}. Canaries: {audit.covers}. A release holds when epsilon_lower <= epsilon_upper.",
            markdown_table(
                [b.as_dict() for b in audit.bounds],
                [*BOUND_COLUMNS, "holds"],
                digits=3,
            ),
            *([noise_section(audit)] if audit.noise else []),
        ]
    )


def noise_section(audit: AuditReport) -> str:
    """The summary's noise checks: each release's noise against its claim with the check's power,
    and the releases' noise against each other."""
    rows = [
        {**c.as_dict(), **{f"power {p['shortfall']:g}x": p["power"] for p in c.power}}
        for c in audit.noise
    ]
    shared = audit.shared
    return "\n\n".join(
        [
            "Each release's noise against its sigma (the exact sum is the server's; power: the chance the "
            "check fails a release whose noise std falls short of the claim by that factor):",
            markdown_table(
                rows,
                [
                    "release",
                    "noise_multiplier",
                    "measured",
                    "p_value",
                    "significance",
                    *(f"power {p['shortfall']:g}x" for p in audit.noise[0].power),
                    "shortfall_at_90",
                    "holds",
                ],
                digits=3,
            ),
            *(
                [
                    f"The releases' noise together (Bartlett's test of independence): p = {shared.p_value:.3g} at "
                    f"significance {shared.significance:.3g}, largest correlation {shared.largest_correlation:.3f} "
                    f"({shared.pair[0]}, {shared.pair[1]}): {'holds' if shared.holds else 'FAILS'}."
                ]
                if shared
                else []
            ),
        ]
    )


def seed_server(seed: int) -> None:
    """The ServerApp's random state, and a generator of Flower's node sampling of its own:
    with the shared one, which clients a round trained depended on how often the heartbeat
    thread had drawn before (``fedsim/seeding.py``)."""
    reseed(SERVER.seed(seed))
    strategy_utils.random = random.Random(SERVER_SAMPLING.seed(seed))
