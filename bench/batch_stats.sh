#!/usr/bin/env bash
# One server build under one gpukv-load line, with what the server's own histograms say of its batches: how
# many ran, their mean size, and the mean queue delay, staging, execution and answering time per batch (the
# differences of each histogram's _sum and _count over the line, from /metrics), plus the server's CPU
# seconds. Writes the key space first (1000-key BatchPuts, 2 s).
#   bash bench/batch_stats.sh "build/server/gpukv-server --cpu_threads=1" --mode=batch --batch=100 --callers=64
# The table flags come first (16 B keys, 8 B values, 4 M slots, as bench/server_ab.sh); the server's flags
# override them. SECS (default 5) sets the line's length.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
read -r binary flags <<<"$1"
shift
port=${PORT:-50092}
metrics_port=${METRICS_PORT:-9499}
# shellcheck disable=SC2086  # the server's flags are words
"$binary" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$metrics_port --capacity=4000000 --key_width=16 \
  --value_width=8 --log_level=warn $flags >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
sleep 1.5
load() { "$root/build/client/gpukv-load" --target=127.0.0.1:$port --keys=1000000 "$@" 2>/dev/null; }
scrape() { curl -s "localhost:$metrics_port/metrics" | grep -E "^gpukv_(batch_[a-z_]*|queue_delay_seconds)_(sum|count) "; }
load --seconds=2 --mode=batch --batch=1000 --callers=16 --get=0 --put=1 >/dev/null
before=$(scrape)
ticks=$(awk '{print $14 + $15}' "/proc/$server/stat")
result=$(load --seconds="${SECS:-5}" "$@" | grep '^RESULT')
ticks=$(( $(awk '{print $14 + $15}' "/proc/$server/stat") - ticks ))
after=$(scrape)
echo "$result" | grep -o 'mode=[a-z]* batch=[0-9]* callers=[0-9]* .*keys_per_s=[0-9]*' | sed 's/ processes.*keys_per_s/ keys_per_s/' | tr '\n' ' '
awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "server_cpu_s=%.2f\n", t / hz}'
paste <(echo "$before") <(echo "$after") | awk '{v[$1] = $4 - $2}
  END {
    n = v["gpukv_batch_size_ops_count"]
    printf "  batches=%d ops_per_batch=%.0f", n, v["gpukv_batch_size_ops_sum"] / n
    split("queue_delay batch_staging batch_execution batch_answer", names, " ")
    for (i = 1; i <= 4; ++i) {
      m = "gpukv_" names[i] "_seconds"
      printf " %s_us=%.0f", names[i], v[m "_sum"] / v[m "_count"] * 1e6
    }
    print ""
  }'
kill -TERM $server
wait $server || true
trap - EXIT
