"""Per-paper experiment protocols, run inside the ServerApp and named by ``protocol.run``.

The only layer that combines a strategy (``fedsim_strategies/``), a task (``fedsim_tasks/``) and a
client's message format (``fedsim_clients/``); the core (``fedsim/``) imports none of them.
"""
