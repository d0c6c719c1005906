"""Every random stream of a run from its seed, one way: ``derived_seed(seed, purpose, *keys)``.

A stream is declared once (:func:`stream`: its purpose and the keys that vary it, e.g. round and
partition) and every draw names those keys: two streams never share a seed (sha256 of the
parts, not arithmetic such as ``seed * 1000 + round * 10 + partition``, which handed client 10
of round 1 client 0's seed of round 2), and a draw that forgets a key is refused rather than
handing every round the same numbers (``tests/test_seeding.py`` draws every declared stream for
3 rounds x 50 clients).

Handlers seed what they know they draw (batch order, sampling, dropout) from their streams;
:func:`reseed` covers what they draw without saying so: library code that calls ``random`` or
``np.random``. Without it those draws depend on the process's history: a Ray actor serves
whichever clients the scheduler gives it, in whichever order, so a client's reply depended on
which other clients had run in the same process before (``tests/test_determinism.py``).

On the server, Flower's strategies sample nodes with the module ``random``, from which Flower's
own threads also draw at moments that depend on timing (the heartbeat's intervals, retry
jitter): the sampling gets a generator of its own (``fedsim/runtime/server_app.py: seed_server``, from
:data:`SERVER_SAMPLING`; this module imports no Flower: the tasks use it). That sample is public
(anyone with the seed recomputes it).

Private randomness is deliberately NOT drawn from the public seed, and not from here: DP noise
and DP client sampling come from the run's secret (``fedsim/privacy/dp.py`` ``NoiseSource``,
``fedsim_strategies/numpy_noise.py``, ``fedsim_strategies/dp_mean.py``), DP-SGD's batches and
noise from the client's OS entropy (``fedsim_tasks/dp_sgd.py``): whoever knows the seed could
otherwise subtract the noise or tell which steps used a record.
"""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import dataclass
from functools import cache

import numpy as np


def derived_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (run seed, purpose, round, partition, ...), the same in every
    process (unlike ``hash``, which Python randomizes per process for strings)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class Stream:
    """One random stream: its seed for a draw is ``derived_seed(seed, purpose, *keys)``, the keys
    in declared order. ``bits`` 32 for an API that takes no larger seed (numpy's legacy
    ``np.random.seed``, which transformers' ``set_seed`` calls)."""

    purpose: str
    keys: tuple[str, ...]
    bits: int = 63

    def seed(self, seed: int, **keys) -> int:
        if set(keys) != set(self.keys):
            raise TypeError(
                f"stream {self.purpose!r} is drawn with keys {self.keys}, not {tuple(keys)}"
            )
        return derived_seed(int(seed), self.purpose, *(keys[k] for k in self.keys)) >> (
            63 - self.bits
        )


STREAMS: dict[str, Stream] = {}
"""every stream declared so far (its module imported), by purpose"""


def stream(purpose: str, *keys: str, bits: int = 63) -> Stream:
    """Declare the stream ``purpose``, varied by ``keys``; a purpose declared twice is refused
    (two modules drawing one stream would draw the same numbers)."""
    if purpose in STREAMS:
        raise ValueError(f"random stream {purpose!r} is declared twice")
    STREAMS[purpose] = Stream(purpose, tuple(keys), bits)
    return STREAMS[purpose]


PROCESS = stream("process", "round", "partition", "message_type")
"""a client process's global state before each handler (``fedsim/runtime/client_app.py``)"""
SERVER = stream("server")
"""the ServerApp process's global state"""
SERVER_SAMPLING = stream("server-sampling")
"""Flower's node sampling"""


def reseed(seed: int) -> None:
    """Seed ``random``, numpy's global generator (from all of ``seed``: an int gives
    ``np.random.seed`` 32 bits, an array of 32-bit words all of them; 37 us against 640 us for a
    state built through ``MT19937``'s SeedSequence, which was a quarter of a FedTP client's time)
    and, where the process has imported it, torch's (CPU and every GPU): a process that never
    imported torch draws nothing from it."""
    random.seed(seed)
    np.random.seed(np.array([seed], dtype=np.uint64).view(np.uint32))  # the seed's two 32-bit words
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if _accelerators(torch):
        torch.manual_seed(seed)
    else:  # the same CPU state: torch.manual_seed also queues a seed for a CUDA not initialized,
        torch.random.default_generator.manual_seed(seed)  # formatting the stack (5 ms a call)


@cache
def _accelerators(torch) -> bool:
    """Whether this process's torch has a device besides the CPU to seed (CUDA, MPS, XPU)."""
    xpu = getattr(torch, "xpu", None)
    return (
        torch.cuda.is_available()
        or torch.backends.mps.is_available()
        or bool(xpu is not None and xpu.is_available())
    )
