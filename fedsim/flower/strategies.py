"""Strategies' and mods' helpers Flower keeps private (imported by ``flwr.serverapp`` and
``flwr.clientapp`` already)."""

# A mod applied around a handler with Flower's own wrapping (the ClientApp's DP mods).
from flwr.client.mod.utils import make_ffn

# The module whose `random` Flower's strategies sample nodes with: fedsim seeds it (server_app) and
# tests give it back.
from flwr.serverapp.strategy import strategy_utils

# Flower's adaptive clipping's base, whose noise draws numpy_noise replaces.
from flwr.serverapp.strategy.dp_adaptive_clipping import DifferentialPrivacyAdaptiveBase

# Flower's helpers fedsim's strategies reuse: metrics aggregated as FedAvg does, nodes sampled as it
# does; and the start log whose ConfigRecord dump fedsim's quiet logs drop (tests/test_run_log.py).
from flwr.serverapp.strategy.strategy_utils import (  # noqa: F401
    aggregate_metricrecords,
    log_strategy_start_info,
    sample_nodes,
)

# The keys of adaptive clipping's messages (the clipping norm sent, the norm bit returned) and the noise
# of its count, which fedsim's privacy tests check their own accounting against.
from flwr.supercore.differential_privacy import (
    KEY_CLIPPING_NORM,
    KEY_NORM_BIT,
    compute_adaptive_noise_params,
)
