#!/usr/bin/env bash
# Installs the Debian packages gpukv needs, if any is missing. The CUDA toolkit (nvcc and its CCCL headers) is
# expected at /usr/local/cuda; without nvcc the build has the CPU backend only, and without the toolkit's headers
# it stops with a message saying so.
#
# Usage: install-deps.sh [GROUP...]    (no group: build)
#   build   compilers, CMake and the libraries the server, client and tests are built with (docker/Dockerfile's
#           build stage installs this group)
#   test    tools the tests run for real: prometheus (the server, for the end-to-end test) and promtool (which
#           the same package ships); openssl (the command), which makes the certificates of the TLS tests;
#           clang, whose -Wthread-safety checks the batcher's lock annotations
#   image   tools the opt-in image test (tests/deploy/image_test.sh) builds and runs the container image with:
#           buildah and debootstrap
set -euo pipefail
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(build)
packages=()
for group in "${groups[@]}"; do
  case "$group" in
    build) packages+=(build-essential cmake libgtest-dev libgmock-dev
             libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libspdlog-dev libxxhash-dev
             prometheus-cpp-dev libssl-dev) ;;
    test) packages+=(prometheus openssl clang) ;;
    image) packages+=(buildah debootstrap) ;;
    *) echo "install-deps: unknown group '$group' (build, test or image)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
