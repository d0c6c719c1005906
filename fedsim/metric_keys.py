"""Reply metric names the core treats specially (no Flower here: the tasks layer imports it)."""

DP_EPSILON = "dp-epsilon"  # a client's DP-SGD epsilon so far, every training of its records (fedsim_tasks/dp_sgd.py)
