"""The SuperNode, its SuperExec and their ClientApp processes, as fedsim starts them with shorter waits
and warm forks (fedsim/run/supernode.py, superexec.py, clientapp_workers.py). Importing this module
costs what ``flower-supernode`` imports (~5 s)."""

# `flower-superexec`'s entry, run by fedsim.run.superexec after it swaps the executor's process start.
from flwr.supercore.cli.flower_superexec import flower_superexec

# Which command each task type starts (a test checks `flwr-clientapp` is still the ClientApp's).
from flwr.supercore.constant import TASK_TYPE_TO_COMMAND

# Flower's exit handlers of a ClientApp message, which a warm worker runs and then returns instead of
# exiting (its tests register some).
from flwr.supercore.exit.exit_handler import (
    add_exit_handler,
    registered_exit_handlers,
    trigger_exit_handlers,
)

# The SuperExec's task poll, which fedsim sets through Flower's variable (a test reads Flower's reading).
from flwr.supercore.superexec import run_superexec

# The executor whose `subprocess` fedsim.run.superexec replaces by warm forks.
from flwr.supercore.superexec.executor import subprocess_executor

# The plugin whose launch_task fedsim.run.superexec wraps to hand a run's messages to its workers.
from flwr.supercore.superexec.plugin.base_exec_plugin import BaseExecPlugin

# The SuperNode's module whose `time` (its hard-coded sleeps) and `subprocess` (its SuperExec's start)
# fedsim.run.supernode replaces.
from flwr.supernode import start_client_internal

# The `flower-supernode` and `flwr-clientapp` entries fedsim's wrappers run after their changes.
from flwr.supernode.cli import flower_supernode, flwr_clientapp

# The ClientApp entry's module, whose flwr_exit and install_from_fab a warm worker replaces.
from flwr.supernode.runtime import run_clientapp
