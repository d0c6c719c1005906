"""How a run starts and is watched: the command line, config and schema, the launcher (SuperLink,
SuperNodes, Ray), sweeps, provenance, progress, the watchdog, the network namespace, TLS."""
