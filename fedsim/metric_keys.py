"""Reply metric names the core treats specially (no Flower here: the tasks layer imports it)."""

DP_EPSILON = "dp-epsilon"  # a client's DP-SGD epsilon spent so far (fedsim_tasks/dp_sgd.py); kept per client and round
