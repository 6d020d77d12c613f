#!/usr/bin/env bash
# Builds the two local base images the image test builds docker/Dockerfile against, because the official CUDA
# images cannot be pulled on machines without registry access:
#   localhost/gpukv-test/base:bookworm    Debian 12 from debootstrap (minbase): stands in for the CUDA base image
#   localhost/gpukv-test/devel:bookworm   the same plus the CCCL headers of the local CUDA toolkit, at the path the
#                                         CUDA devel image has them: stands in for the devel image, without nvcc
#                                         (the host code needs libcu++ even when the CUDA backend is off)
# Both are kept in buildah's store under $GPUKV_IMAGE_TEST_DIR and reused; delete that folder to rebuild them.
# Usage: make_test_bases.sh (needs root, buildah and debootstrap; deploy/install-deps.sh image installs them)
set -euo pipefail
dir=${GPUKV_IMAGE_TEST_DIR:?set GPUKV_IMAGE_TEST_DIR}
mirror=${GPUKV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cccl=${GPUKV_CCCL_DIR:-/usr/local/cuda/include/cccl}
bah() { buildah --root "$dir/storage" --runroot "$dir/run" --storage-driver vfs "$@"; }

if ! bah inspect --type image localhost/gpukv-test/base:bookworm >/dev/null 2>&1; then
  echo "make_test_bases: debootstrap bookworm from $mirror"
  rm -rf "$dir/rootfs"
  debootstrap --variant=minbase bookworm "$dir/rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
    { tail -20 "$dir/debootstrap.log"; exit 1; }
  # The rootfs as one layer; /dev, /proc and /sys are filled by whatever runs the container.
  tar -C "$dir/rootfs" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -cf "$dir/rootfs.tar" .
  ctr=$(bah from scratch)
  bah add "$ctr" "$dir/rootfs.tar" /
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$ctr"
  bah commit --rm "$ctr" localhost/gpukv-test/base:bookworm >/dev/null
  rm -rf "$dir/rootfs" "$dir/rootfs.tar"
fi

if ! bah inspect --type image localhost/gpukv-test/devel:bookworm >/dev/null 2>&1; then
  [ -f "$cccl/cuda/atomic" ] || { echo "make_test_bases: no CCCL headers at $cccl (set GPUKV_CCCL_DIR)"; exit 1; }
  ctr=$(bah from --pull=never localhost/gpukv-test/base:bookworm)
  bah copy "$ctr" "$cccl" /usr/local/cuda/include/cccl
  bah commit --rm "$ctr" localhost/gpukv-test/devel:bookworm >/dev/null
fi
bah images
