"""Per-paper experiment protocols, run inside the ServerApp and named by ``protocol.run``.

The only layer that combines a strategy (``strategies/``), a task (``tasks/``) and a client's
message format (``clients/``); the core (``fedsim/``) imports none of them.
"""
