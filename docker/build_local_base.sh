#!/bin/sh
# build_local_base.sh [TAG]: a base image with Debian bookworm's python3 (3.11) and venv, made
# from Debian's packages, for machines that reach a Debian mirror but no image registry.
# Needs root, debootstrap and a Docker engine. Then build with BASE_IMAGE=TAG (docker/build.sh).
set -eu
tag=${1:-fedsim-base:local}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/fedsim-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$root" "$mirror"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* "$root"/tmp/*
tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$tag"
docker image ls "$tag"
