#!/bin/sh
# build.sh [cpu|gpu]: build fedsim's images from docker/Dockerfile with BuildKit.
#   cpu (default): fedsim-superlink:latest, fedsim-serverapp:cpu, fedsim-supernode:cpu
#   gpu:           fedsim-supernode:gpu (PyPI's CUDA torch; build it where a GPU is)
# Environment: BASE_IMAGE (python:3.11-slim), TORCH_INDEX_URL (cpu: PyPI + PyTorch's CPU index;
# "" = PyPI + docker/wheels only), WHEELS (folder whose *.whl are linked into docker/wheels),
# PIP_CA (CA bundle pip must trust, passed as a build secret), PIP_CONF (a pip.conf, ditto),
# NETWORK (docker build --network, e.g. host), DOCKER (a client that builds with BuildKit:
# `docker` with buildx, or the classic client, run here with DOCKER_BUILDKIT=1).
set -eu
cd "$(dirname "$0")/.."
variant=${1:-cpu}
base=${BASE_IMAGE:-python:3.11-slim}
export DOCKER_BUILDKIT=1
if [ -n "${WHEELS:-}" ]; then
    for wheel in "$WHEELS"/*.whl; do
        ln -f "$wheel" docker/wheels/ 2>/dev/null || cp "$wheel" docker/wheels/
    done
fi
set -- --build-arg "BASE_IMAGE=$base"
[ -n "${PIP_CA:-}" ] && set -- "$@" --secret "id=pip_ca,src=$PIP_CA"
[ -n "${PIP_CONF:-}" ] && set -- "$@" --secret "id=pip_conf,src=$PIP_CONF"
[ -n "${NETWORK:-}" ] && set -- "$@" --network "$NETWORK"
if [ "$variant" = gpu ]; then
    set -- "$@" --build-arg TORCH_VARIANT=cuda --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-}"
    builds="supernode=fedsim-supernode:gpu"
else
    set -- "$@" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
    builds="superlink=fedsim-superlink:latest serverapp=fedsim-serverapp:cpu supernode=fedsim-supernode:cpu"
fi
for build in $builds; do
    start=$(date +%s)
    ${DOCKER:-docker} build -f docker/Dockerfile --target "${build%%=*}" -t "${build#*=}" "$@" .
    echo "build.sh: ${build#*=} built in $(( $(date +%s) - start )) s"
done
