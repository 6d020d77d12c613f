#!/usr/bin/env bash
# Server builds or settings side by side on this machine, alternating for ROUNDS rounds (default 3): per
# variant, a unary GET line and a 100-key BatchGet line (64 callers, SECS seconds each, default 5; WORKLOADS,
# gpukv-load flags with lines separated by ";", replaces them) with the
# server's CPU time per call (from /proc) and its allocations per call (bench/malloc_count.so preloaded), two
# figures that move less than the rate with the VM's changing speed. A variant is "name=binary flags...":
#   bash bench/server_ab.sh "base=/tmp/gpukv-server.base" "new=build/server/gpukv-server"
# The table flags come first (16 B keys, 8 B values, 4 M slots); a variant's flags override them. Prints one
# line per variant and workload; needs build/ (gpukv-load, malloc_count.so).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
load=$root/build/client/gpukv-load
preload=$root/build/bench/malloc_count.so
secs=${SECS:-5}
port=${PORT:-50089}
target=--target=127.0.0.1:$port
err=$(mktemp)
server=
trap 'rm -f "$err"; [[ -z $server ]] || kill "$server" 2>/dev/null || true' EXIT  # a failed line stops the server too
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime of the server
mallocs() {  # the server's malloc count now
  kill -USR1 "$1"
  sleep 0.2
  awk '/^MALLOCS/ {n = $2} END {print n}' "$err"
}
for round in $(seq 1 "${ROUNDS:-3}"); do
  for variant in "$@"; do
    name=${variant%%=*}
    read -r binary flags <<<"${variant#*=}"
    : > "$err"
    # shellcheck disable=SC2086  # the variant's flags are words
    LD_PRELOAD=$preload "$binary" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:0 --capacity=4000000 \
      --key_width=16 --value_width=8 --log_level=warn $flags >/dev/null 2>"$err" &
    server=$!
    sleep 1.5
    "$load" "$target" --seconds=2 --keys=1000000 --mode=batch --batch=1000 --callers=16 --get=0 --put=1 >/dev/null 2>&1
    "$load" "$target" --seconds=1 --keys=1000000 --mode=unary --callers=64 --get=1 --put=0 >/dev/null 2>&1
    IFS=';' read -r -a workloads <<<"${WORKLOADS:---mode=unary --callers=64;--mode=batch --batch=100 --callers=64}"
    for workload in "${workloads[@]}"; do
      ticks=$(cpu_ticks $server)
      before=$(mallocs $server)
      # shellcheck disable=SC2086
      result=$("$load" "$target" --seconds="$secs" --keys=1000000 $workload --get=1 --put=0 2>/dev/null | grep '^RESULT')
      after=$(mallocs $server)
      ticks=$(( $(cpu_ticks $server) - ticks ))
      calls=$(grep -o 'total_calls=[0-9]*' <<<"$result" | cut -d= -f2)
      keys=$(grep -o 'keys_per_s=[0-9]*' <<<"$result" | cut -d= -f2)
      awk -v r="$round" -v n="$name" -v w="$(grep -o 'mode=[a-z]* batch=[0-9]*' <<<"$result")" -v k="$keys" \
          -v c="$calls" -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v m=$((after - before)) \
          'BEGIN {printf "round=%s %s %s keys_per_s=%s server_us_per_call=%.1f mallocs_per_call=%.2f\n", r, n, w, k, t / hz * 1e6 / c, m / c}'
    done
    kill -TERM $server
    wait $server || true
    server=
  done
done
