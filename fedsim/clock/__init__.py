"""The virtual clock: each client's speed, bandwidth and availability (``traces``), and a round's
schedule computed from them, never slept (``schedule``); docs/clock.md."""
