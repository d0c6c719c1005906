"""CKKS homomorphic averaging: crypto (``ckks``), the wire keys both sides use (``messages``), the
client half (``client``: a node's key and aggregate copies) and the layer the ClientApp puts around
any handler that exchanges weights (``layer``). The server half is ``fedsim_strategies/he_fedavg.py``."""
