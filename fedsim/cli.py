"""``fedsim run KEY=VALUE ...``: compose the config, check it, run it through Flower."""

from __future__ import annotations

import argparse
import sys

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from fedsim.config import ConfigError, compose
from fedsim.launcher import Interrupted, RunFailed, launch
from fedsim.schema import check


def run(overrides: list[str]) -> int:
    try:
        cfg = compose(overrides)
        check(cfg)
        instantiate(cfg.strategy)  # bad strategy values fail here, before any process starts
        task = OmegaConf.to_container(cfg.task, resolve=True)
        nodes = cfg.hardware.num_supernodes or get_class(task["client"]).population_size(
            task, cfg.data_root)
    except (ConfigError, InstantiationException, ValueError, FileNotFoundError, ImportError) as exc:
        print(f"fedsim: configuration error:\n{exc}", file=sys.stderr)
        return 2
    # the ServerApp composes again from the same overrides: pin what was resolved here
    pinned = [*overrides, f"data_root={cfg.data_root}", f"results_dir={cfg.results_dir}"]
    try:
        outcome = launch(cfg, pinned, int(nodes))
    except RunFailed as exc:
        print(f"fedsim: run failed:\n{exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print("fedsim: interrupted; nothing left running", file=sys.stderr)
        return exc.exit_code
    print(f"fedsim: run {outcome['run_id']} {outcome['status']}; results in {outcome['results_dir']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run an experiment: fedsim run experiment=fedtp_paper ...")
    run_p.add_argument("overrides", nargs="*", help="Hydra overrides KEY=VALUE")
    args = parser.parse_args(argv)
    return run(args.overrides)


if __name__ == "__main__":
    sys.exit(main())
