"""CKKS homomorphic averaging: crypto (``ckks``), the wire keys both sides use (``messages``)
and the client half (``client``). The server half is ``fedsim_strategies/he_fedavg.py``."""
