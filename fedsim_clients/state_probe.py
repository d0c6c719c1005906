"""Test fixture, not a method: the smallest client that keeps state across the rounds of a run
(``fedsim/runtime/client_state.py``), for the end-to-end tests of that mechanism in every layout
(``tests/test_e2e_client_state.py``). It sits in the installed package, not under ``tests/``,
because the ClientApp of every layout (a Ray actor, a SuperNode's process) must import it.

It speaks FedTP's aggregation protocol (``experiment=fedtp_aggregate
task.client=fedsim_clients.state_probe.StateProbeClient hardware.num_clients=N``; it reads no data, so
the client count is the run's). Client p holds a fixed vector ``own`` of its own (a Dirichlet
draw seeded by p). Round t: read the value it saved before round t (round 1: ``own``), mix it
with the release the server sent, ``w_t = (w_{t-1} + g_t) / 2``, save ``w_t`` as round t's
value, and send ``(w_t + own) / 2``: the state moves the release, yet no state array is sent.
The saved value also holds the rounds it has seen and whose it is (a resumed round that read
its own value, or two clients sharing a folder, would show there) and a secret that no message
may carry.

``FEDSIM_STATE_PROBE_HOLD=<partition>:<round>:<file>`` in the client's environment (the test is
the node's operator; a simulation's clients inherit ``fedsim run``'s environment) holds that
client's reply to that round, after it saved the round, until ``file`` exists: a test kills the
run at that point, which no timing decides, and creates the file to release the client.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedsim.runtime import client_state
from fedsim_clients import fedtp_messages as keys
from fedsim_clients.handler import ClientHandler

NAME = "probe"  # the client-state name of the value
HOLD_ENV = "FEDSIM_STATE_PROBE_HOLD"


def secret(partition_id: int) -> np.ndarray:
    """32 bytes that only client ``partition_id``'s state holds (tests look for them elsewhere)."""
    return np.frombuffer(
        hashlib.sha256(f"state-probe secret {partition_id}".encode()).digest(), np.uint8
    )


class StateProbeClient(ClientHandler):
    def train(self, msg: Message) -> RecordDict:
        server_round = self.server_round(msg.content[keys.CONFIG])
        g = msg.content[keys.ARRAYS][keys.VECTORS].numpy().reshape(1, -1)
        own = np.random.default_rng(self.partition_id).dirichlet(np.ones(g.shape[1]))[None]
        state = client_state.of(msg, self.partition_id)
        before = state.load(NAME, server_round) or {"w": own, "rounds": np.zeros(0, np.int64)}
        w = (before["w"] + g) / 2
        state.save(
            NAME,
            server_round,
            {
                "w": w,
                "rounds": np.append(before["rounds"], server_round),
                "partition": np.array([self.partition_id]),
                "secret": secret(self.partition_id),
            },
        )
        self._hold(server_round)
        return RecordDict(
            {
                keys.ARRAYS: ArrayRecord({keys.VECTORS: Array((w + own) / 2)}),
                keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 1}),
            }
        )

    def _hold(self, server_round: int) -> None:
        partition, held_round, release = os.environ.get(HOLD_ENV, "-1:-1:").split(":", 2)
        while (int(partition), int(held_round)) == (self.partition_id, server_round) and not Path(
            release
        ).exists():
            time.sleep(0.05)
