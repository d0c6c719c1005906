"""fedsim's one door to Flower's private modules: everything fedsim imports from Flower outside its
public API (``flwr.app``, ``flwr.serverapp``, ``flwr.serverapp.strategy``, ``flwr.clientapp``,
``flwr.simulation``, the public names of ``flwr.common``) is re-exported here, each name with why
fedsim needs it, so a Flower upgrade starts in this folder (docs/architecture.md, Flower's private
names; tests/test_flower_adapter.py refuses such an import anywhere else).

One module per process that needs it, so that no process pays for another's imports:
:mod:`.messages` (any: a Message's wire form and object transfer), :mod:`.strategies` (the
ServerApp's strategies and the ClientApp's mods), :mod:`.grid` (the ServerApp in a deployment),
:mod:`.processes` (the SuperNode, its SuperExec and their ClientApp processes), :mod:`.cli` (the
``flwr`` CLI's config, FAB and Control API). This package imports none of them.
"""
