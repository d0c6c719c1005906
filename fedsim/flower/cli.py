"""The ``flwr`` CLI's config, the FAB, Flower's run config and the Control API: what ``fedsim
federations`` and the tests of ``flwr run .``, packaging and a local SuperLink use."""

# `flwr` itself, run by fedsim/run/flwr_run.py with the file walk of the module that builds its FAB
# (flwr.cli.build) kept out of the top-level .venv; Flower's own walk, for the test comparing the two.
from flwr.cli import build as fab_build
from flwr.cli.app import app as flwr_cli

# A FAB built and installed as `flwr run` and a SuperNode do (tests: the FAB runs its own code).
from flwr.cli.build import build_fab_from_disk

# The interceptor the `flwr` CLI puts on its Control API client (a local SuperLink's takeover test).
from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor

# Flower's CLI config ($FLWR_HOME/config.toml), where `fedsim federations` writes named connections.
from flwr.cli.flower_config import (
    init_flwr_config,
    read_superlink_connection,
    write_superlink_connection,
)
from flwr.cli.install import install_from_fab

# `flwr run`'s parsing of --federation-config (tests: the sizes fedsim documents are ones Flower reads).
from flwr.cli.run.run import _parse_federation_config_overrides

# A named connection and its simulation options, as Flower's CLI config types them.
from flwr.cli.typing import (
    SimulationBackendConfig,
    SimulationClientResources,
    SimulationInitArgs,
    SuperLinkConnection,
    SuperLinkSimulationOptions,
)
from flwr.cli.utils import collect_files

# `flwr run --run-config`'s parsing and the app's [tool.flwr.app.config] fused with it (tests: fedsim's
# keys, presets and documented commands pass Flower's own parsing).
from flwr.common.config import get_fused_config_from_dir, parse_config_args

# The Control API's request for the runs a SuperLink holds (the takeover test asks a SuperLink for them).
from flwr.proto.control_pb2 import ListRunsRequest

# The simulation settings a local SuperLink derives from a connection (tests: `fedsim federations`).
from flwr.simulation.app import _run_simulation_settings

# The Control API's client and the version header the `flwr` CLI sends with it (the takeover test).
from flwr.supercore.control import ControlHttpClient
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
