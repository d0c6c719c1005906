"""How a run starts and is watched, the core's top floor, imported by no package: the command line,
the launcher (SuperLink, SuperNodes, Ray), sweeps, the watchdog, the network namespace, TLS."""
