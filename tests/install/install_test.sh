#!/usr/bin/env bash
# The table library as a program outside the project gets it: `cmake --install` of a build into an empty
# prefix, then tests/install/consumer configured against that prefix alone (find_package(gpukv), the target
# gpukv::table), built and run. Promised: the package installs only the public headers (gpukv/table.hpp,
# gpukv/types.hpp and gpukv/batch.hpp), and a program that links it stores and reads back keys.
# Usage: tests/install/install_test.sh [BUILD_DIR]   (default build/; tests/run_all.sh runs it)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
prefix=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$prefix" "$work"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
if [ "$headers" != "./gpukv/batch.hpp ./gpukv/table.hpp ./gpukv/types.hpp " ]; then
  echo "install_test: the package installs these headers, not only the public three: $headers" >&2
  exit 1
fi
cmake -S "$root/tests/install/consumer" -B "$work" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work" -j"${GPUKV_JOBS:-2}" >/dev/null
"$work/consumer"
