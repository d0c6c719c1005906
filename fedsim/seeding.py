"""Process-wide random state fixed by the run's seed, so that one seed fixes a run's result.

Handlers seed what they know they draw (batch order, sampling); this module covers what they
draw without saying so: dropout masks, library code that calls ``random`` or ``np.random``.
Without it those draws depend on the process's history: a Ray actor serves whichever clients
the scheduler gives it, in whichever order, so a client's reply depended on which other
clients had run in the same process before (``tests/test_determinism.py``).

On the server, Flower's strategies sample nodes with the module ``random``, from which Flower's
own threads also draw at moments that depend on timing (the heartbeat's intervals, retry
jitter): the sampling gets a generator of its own (:func:`seed_server`). That sample is public
(anyone with the seed recomputes it): under DP the clients are sampled from the run's secret
instead (``fedsim_strategies/numpy_noise.py``, ``fedsim_strategies/dp_mean.py``).
"""

from __future__ import annotations

import hashlib
import random
import sys

import numpy as np


def derived_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (run seed, round, partition, ...), the same in every process
    (unlike ``hash``, which Python randomizes per process for strings)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def reseed(seed: int) -> None:
    """Seed ``random``, numpy's global generator and, where the process has imported it,
    torch's (CPU and every GPU): a process that never imported torch draws nothing from it."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def seed_server(seed: int) -> None:
    """The ServerApp's random state, and a generator of Flower's node sampling of its own:
    with the shared one, which clients a round trained depended on how often the heartbeat
    thread had drawn before."""
    from flwr.serverapp.strategy import strategy_utils
    reseed(seed)
    strategy_utils.random = random.Random(seed)
