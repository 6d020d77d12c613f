#!/usr/bin/env bash
# A/B of the sharded client's cost: two gpukv-load builds (BASE and HEAD, paths to their binaries), each
# through the plain client to one transport_ceiling_server (--target) and through the sharded client to two
# (--targets), alternated over three rounds. The servers answer without a table, so what differs is the
# client: its CPU per key is the load's user+sys time (bash's time) over the keys it completed.
# Usage: BASE=/path/to/old/gpukv-load HEAD=build/client/gpukv-load bench/cluster_client_ab.sh [build dir]
set -uo pipefail
build=${1:-build}
: "${BASE:?path to the base gpukv-load}" "${HEAD:=$build/client/gpukv-load}"
"$build/bench/transport_ceiling_server" --listen=127.0.0.1:50301 >/dev/null 2>&1 &
s1=$!
"$build/bench/transport_ceiling_server" --listen=127.0.0.1:50302 >/dev/null 2>&1 &
s2=$!
trap 'kill $s1 $s2' EXIT
sleep 1
TIMEFORMAT="%U %S"
out=$(mktemp)
for round in 1 2 3; do
  for which in base head; do
    bin=$([[ $which == base ]] && echo "$BASE" || echo "$HEAD")
    for shape in "--batch=1000 --callers=8" "--batch=10000 --callers=4" "--batch=1000 --callers=8 --get=0.5 --put=0.45"; do
      for t in "--target=127.0.0.1:50301" "--targets=127.0.0.1:50301,127.0.0.1:50302"; do
        { time "$bin" $t --seconds=3 --mode=batch $shape --keys=1000000 >"$out" 2>&1; } 2>"$out.time"
        keys=$(grep -o 'keys_per_s=[0-9]*' "$out" | cut -d= -f2)
        read -r user sys <"$out.time"
        awk -v r="$round" -v b="$which" -v sh="$shape" -v t="${t%%=*}" -v k="${keys:-0}" -v u="$user" -v s="$sys" \
          'BEGIN {printf "AB round=%s build=%s %s shape=\"%s\" keys_per_s=%.2fM client_ns_per_key=%.1f\n", r, b, t, sh, k / 1e6, k ? (u + s) * 1e9 / (k * 3) : 0}'
      done
    done
  done
done
rm -f "$out" "$out.time"
