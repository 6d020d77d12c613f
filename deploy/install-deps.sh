#!/usr/bin/env bash
# Installs the Debian packages gpukv builds with, if any is missing. The CUDA toolkit (nvcc and its CCCL
# headers) is expected at /usr/local/cuda; without nvcc the build has the CPU backend only, and without the
# toolkit's headers it stops with a message saying so.
set -euo pipefail
packages=(build-essential cmake libgtest-dev libgmock-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libspdlog-dev prometheus-cpp-dev)
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
