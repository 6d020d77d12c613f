#!/usr/bin/env bash
# One command from README.md: installs the Debian packages gpukv needs, builds the server and starts it in
# the foreground (Ctrl-C or SIGTERM drains it), with the CLI (build/client/gpukv) and the load generator
# (build/client/gpukv-load) built beside it. On a machine without a GPU it runs the CPU backend.
# Flags pass through (deploy/start-server.sh --capacity=100000000); GPUKV_<FLAG> variables set them too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"${GPUKV_JOBS:-2}" --target gpukv-server gpukv gpukv-load
exec "$root/build/server/gpukv-server" "$@"
