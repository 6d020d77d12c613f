# Shared by the service scripts that run on the lent GPU machine (service_gpu.sh, server_ab.sh): start a
# server, drive it with gpukv-load, and read what it did (per-thread CPU, batch metrics). Sourced from the
# repository root with $log_name set; logs to $OUT/$log_name.log.
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
log=$out/${log_name:?}.log
secs=${SECONDS_PER_RUN:-6}
: > "$log"
echo "# $(date -u +%FT%TZ) $(nproc) cores $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$log"

# serve <port> <flags...>: starts a server ($server_bin, default the bundle's gpukv-server) and waits until it
# answers health checks.
serve() {
  local port=$1
  shift
  "${server_bin:-$bundle/bin/gpukv-server}" --listen=127.0.0.1:"$port" --metrics_listen=127.0.0.1:0 --backend="${BACKEND:-gpu}" --log_level=warn "$@" \
    >>"$out/server.log" 2>&1 &
  server=$!
  wait_serving "$port"
}
# wait_serving <port>: returns once the server there answers health checks, or fails after 60 s.
wait_serving() {
  for _ in $(seq 1 60); do
    "$bundle/bin/gpukv" --target=127.0.0.1:"$1" health >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server on $1 did not come up" | tee -a "$log"
  return 1
}
load() { "$bundle/bin/gpukv-load" --seconds="$secs" "$@" 2>&1 | grep -E 'RESULT|error|Error' | tee -a "$log"; }
# Per-thread CPU time of the latest server, as "tid name nanoseconds" (schedstat's first field).
thread_ns() {
  local t
  for t in /proc/"$server"/task/*; do
    [[ -r $t/schedstat ]] && echo "${t##*/} $(cat "$t/comm" | tr -d ' ') $(cut -d' ' -f1 "$t/schedstat")"
  done
}
# cpu_of <label> <command...>: runs the command, then prints how many cores each kind of server thread used
# meanwhile (threads grouped by name: gRPC's pollers and executors, the server's own threads).
cpu_of() {
  local label=$1 before after t0 t1
  shift
  before=$(thread_ns)
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  after=$(thread_ns)
  join <(sort <<<"$before") <(sort <<<"$after") |
    awk -v ns="$((t1 - t0))" -v l="$label" \
      '{d[$2] += $5 - $3; n[$2]++} END {for (k in d) printf "CPU %s %s threads=%d cores=%.2f\n", l, k, n[k], d[k] / ns}' |
    sort -t= -k3 -rn | tee -a "$log"
}
# scrape <pattern>: the lines of the latest server's metrics (no curl there: bash's /dev/tcp) that match the
# extended regular expression, logged.
scrape() {
  local port
  port=$(grep -o 'metrics on port [0-9]*' "$out/server.log" | tail -1 | awk '{print $4}')
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 0
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  grep -E "$1" <&3 | tee -a "$log"
  exec 3>&-
}
# The latest server's batch counters: how many batches, how large, how long each waited in the queue, was
# staged (columns copied in), executed (copies and kernels) and answered (results written into the calls).
batch_metrics() {
  scrape '^gpukv_(batch_size_ops|batch_(execution|staging|answer)_seconds|queue_delay_seconds)_(sum|count)|^gpukv_batches_total'
}
# The counters are cumulative: the difference between successive snapshots belongs to the run between them.
load_then_metrics() {
  load "$@"
  batch_metrics
}

# Several servers at once (cluster mode). start_shard <port> <gpu> <flags...>: a server on GPU <gpu> alone
# (CUDA_VISIBLE_DEVICES), metrics on <port>+1000; waits until it answers health checks. Its pid joins
# $shards and its metrics port $shard_metrics; stop_shards drains them all.
shards=()
shard_metrics=()
start_shard() {
  local port=$1 gpu=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$gpu "${server_bin:-$bundle/bin/gpukv-server}" --listen=127.0.0.1:"$port" \
    --metrics_listen=127.0.0.1:$((port + 1000)) --backend="${BACKEND:-gpu}" --log_level=warn "$@" >>"$out/server.log" 2>&1 &
  shards+=($!)
  shard_metrics+=($((port + 1000)))
  wait_serving "$port"
}
stop_shards() {
  ((${#shards[@]})) && kill -TERM "${shards[@]}" && wait "${shards[@]}"
  shards=()
  shard_metrics=()
}
# CPU time of a whole process so far, in nanoseconds (its threads' schedstat).
process_ns() {
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'
}
# metric <port> <name>: a metric's value (summed over its label sets) from a server's metrics port.
metric() {
  exec 3<>"/dev/tcp/127.0.0.1/$1" || { echo 0; return; }
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%.6f", s}' <&3
  exec 3>&-
}
# The host's busy CPU time so far, in seconds summed over its cores (/proc/stat: all but idle and iowait).
host_busy_s() {
  awk '/^cpu / {printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / 100}' /proc/stat
}
# measure <label> <gpukv-load flags...>: one load line, then what each of $shards did meanwhile: the cores
# its threads used and the share of the time a batch of it was executing (copies and kernels, from its
# gpukv_batch_execution_seconds); each GPU's utilization as nvidia-smi samples it (the share of time some
# kernel ran); the cores the load processes used; and the cores busy on the whole host.
measure() {
  local label=$1 i t0 t1 h0 h1 smi=
  shift
  local -a cpu0 ex0
  for i in "${!shards[@]}"; do
    cpu0[i]=$(process_ns "${shards[i]}")
    ex0[i]=$(metric "${shard_metrics[i]}" gpukv_batch_execution_seconds_sum)
  done
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 250 >"$out/smi.tmp" 2>/dev/null &
    smi=$!
  fi
  h0=$(host_busy_s)
  t0=$(date +%s%N)
  local TIMEFORMAT="LOAD $label cores=%P"
  { time load "$@"; } 2>"$out/time.tmp"
  t1=$(date +%s%N)
  h1=$(host_busy_s)
  [[ -n $smi ]] && kill "$smi" && wait "$smi" 2>/dev/null
  for i in "${!shards[@]}"; do
    awk -v l="$label" -v i="$i" -v c0="${cpu0[i]}" -v c1="$(process_ns "${shards[i]}")" -v e0="${ex0[i]}" \
      -v e1="$(metric "${shard_metrics[i]}" gpukv_batch_execution_seconds_sum)" -v ns="$((t1 - t0))" \
      'BEGIN {printf "SHARD %s shard=%d cores=%.2f batch_executing=%.1f%%\n", l, i, (c1 - c0) / ns, 100 * (e1 - e0) * 1e9 / ns}' |
      tee -a "$log"
  done
  [[ -n $smi ]] && awk -F', ' -v l="$label" '{s[$1] += $2; n[$1]++} END {for (g in s) printf "GPU %s gpu=%s utilization=%.1f%%\n", l, g, s[g] / n[g]}' \
    "$out/smi.tmp" | sort | tee -a "$log"
  # bash's time reports the load's CPU (its processes included) as a percentage of one core.
  awk '/^LOAD/ {sub("cores=", "", $3); printf "%s %s load_cores=%.2f\n", $1, $2, $3 / 100}' "$out/time.tmp" | tee -a "$log"
  awk -v l="$label" -v b0="$h0" -v b1="$h1" -v ns="$((t1 - t0))" -v n="$(nproc)" \
    'BEGIN {printf "HOST %s busy_cores=%.2f of %d\n", l, (b1 - b0) * 1e9 / ns, n}' | tee -a "$log"
  return 0
}
