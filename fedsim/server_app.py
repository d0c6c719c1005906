"""The one ServerApp: compose the Hydra config named by the run config and run its protocol.

``flwr run .`` passes no overrides and runs the default experiment; ``fedsim run`` passes the
user's overrides as one string under the run-config key ``overrides``. The protocol sends every
phase through one :class:`~fedsim.messaging.Messenger`, whose fault counts and traffic go into
every ``results.json`` (``faults``, ``communication``), also when the protocol fails.
"""

from __future__ import annotations

import logging
import shlex
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from hydra.utils import get_method

from fedsim.config import compose
from fedsim.messaging import Messenger
from fedsim.results import RunOutput

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    logger = logging.getLogger("fedsim")
    if not logger.handlers:  # Flower's own handlers stay as they are
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s fedsim: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    cfg = compose(shlex.split(str(context.run_config.get("overrides", ""))))
    out = RunOutput(cfg.results_dir)
    out.write_config(cfg)
    logging.getLogger("fedsim").info("results -> %s", out.path)
    messenger = Messenger(grid, float(cfg.round_timeout))
    try:
        results, summary = get_method(cfg.protocol.run)(messenger, cfg, out)
        # traffic per phase and round, beside any per-method summary the protocol made
        results.update(faults=messenger.faults,
                       communication={**messenger.traffic, **results.get("communication", {})})
        out.write_results(results, summary)
        print(summary, flush=True)
    except BaseException:
        out.write_error(traceback.format_exc()
                        + f"\nfaults so far: {messenger.faults}\n")
        raise
