#!/bin/sh
# supernodes.sh N [gpu]: compose services supernode-0 .. supernode-(N-1) (partition ids 0..N-1 of
# N) that extend or replace compose.yaml's two; "gpu" puts them on the GPU image. From docker/:
#   ./supernodes.sh 4 > compose.override.yaml && docker compose up -d
# (docker compose merges compose.override.yaml beside compose.yaml by itself; with -f, add it).
set -eu
n=$1
image=fedsim-supernode:cpu
build="{context: .., dockerfile: docker/Dockerfile, target: supernode}"
if [ "${2:-}" = gpu ]; then
    image=fedsim-supernode:gpu
    build="{context: .., dockerfile: docker/Dockerfile, target: supernode, args: {TORCH_VARIANT: cuda, TORCH_INDEX_URL: \"\"}}"
fi
echo "services:"
i=0
while [ "$i" -lt "$n" ]; do
    cat <<YAML
  supernode-$i:
    image: $image
    build: $build
    network_mode: host
    user: "\${FEDSIM_UID:-1000}:\${FEDSIM_GID:-1000}"
    volumes: ["\${FEDSIM_CERTS:-./certs}/ca.pem:/certs/ca.pem:ro", "\${FEDSIM_CERTS:-./certs}/node-$i.key:/certs/node-$i.key:ro",
              "\${FEDSIM_DATA:-../../shared/data}:/data:ro"]
    depends_on: [superlink]
    restart: on-failure
    command: ["--root-certificates", "/certs/ca.pem", "--superlink", "\${FEDSIM_SUPERLINK:-127.0.0.1:9093}",
              "--auth-supernode-private-key", "/certs/node-$i.key", "--port", "\${FEDSIM_NODE${i}_PORT:-$((9094 + i))}",
              "--node-config", 'partition-id=$i num-partitions=$n data-root="/data"']
YAML
    if [ "$image" = fedsim-supernode:gpu ]; then
        echo "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: all, capabilities: [gpu]}]}}}"
    fi
    i=$((i + 1))
done
# registration mounts the CA (its TLS to the SuperLink) and the N public keys, nothing else
printf '  register:\n    volumes: ["${FEDSIM_CERTS:-./certs}/ca.pem:/certs/ca.pem:ro", '
i=0
while [ "$i" -lt "$n" ]; do
    printf '"${FEDSIM_CERTS:-./certs}/node-%s.pub:/certs/node-%s.pub:ro"%s' "$i" "$i" "$([ $((i + 1)) -lt "$n" ] && echo ', ')"
    i=$((i + 1))
done
printf ']\n    command: ['
i=0
while [ "$i" -lt "$n" ]; do
    printf '"/certs/node-%s.pub"%s' "$i" "$([ $((i + 1)) -lt "$n" ] && echo ', ')"
    i=$((i + 1))
done
printf ']\n'
