"""The core's ground floor, which every layer reads: the config's composition (``compose``) and typed
schema (``schema``: the run's blocks, strategy slots, sweep settings), the data root (``data``) and what
a node decides for itself (``node_local``)."""
