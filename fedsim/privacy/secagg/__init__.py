"""SecAgg+ on fedsim's Message-API path: the protocol (``protocol.py``), its message keys
(``messages.py``); the server half is ``fedsim_strategies/secagg.py``, the client layer
``fedsim/runtime/secagg_layer.py``."""
