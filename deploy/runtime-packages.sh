#!/usr/bin/env bash
# Prints, one per line, the packages that own the shared libraries the given binaries load. docker/Dockerfile's
# build stage runs it on gpukv-server and the CLI and its runtime stage installs exactly these packages, so the
# runtime image holds what the binaries need and nothing else, under the package names of whatever distribution
# release the two base images share (Debian 12 and Ubuntu 24.04 name the same libraries differently).
#
# Libraries under /usr/local/cuda come with the CUDA base image and libcuda.so is put in the container by the
# NVIDIA container toolkit, so neither is listed. A library that no package owns, or that ldd cannot find, is an
# error: an image missing it would fail only when started.
# Usage: runtime-packages.sh BINARY...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: runtime-packages.sh BINARY..." >&2; exit 2; }

owner() {  # the package that owns $1; dpkg records some paths under /lib and some under /usr/lib (merged /usr)
  local lib=$1 real candidate
  real=$(readlink -f "$lib")
  for candidate in "$lib" "$real" "/usr${lib}" "${lib#/usr}" "/usr${real}" "${real#/usr}"; do
    if out=$(dpkg-query -S "$candidate" 2>/dev/null); then
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

ldd "$@" | awk '/=> not found/ { print "MISSING " $1; next } /=> \// { print $3 }' | sort -u |
  while read -r lib rest; do
    if [ "$lib" = MISSING ]; then echo "runtime-packages: ldd cannot find $rest" >&2; exit 1; fi
    case "$lib" in /usr/local/cuda*|*/libcuda.so*) continue ;; esac
    owner "$lib" || { echo "runtime-packages: no package owns $lib" >&2; exit 1; }
  done | sort -u
