# Shared by the service scripts that run on the lent GPU machine (service_gpu.sh, server_ab.sh): start a
# server, drive it with gpukv-load, and read what it did (per-thread CPU, batch metrics). Sourced from the
# repository root with $log_name set; logs to $OUT/$log_name.log.
bundle=.device/bundle
[[ -d $bundle ]] || tar xzf .device/bundle.tgz -C .device
export LD_LIBRARY_PATH=$bundle/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
log=$out/${log_name:?}.log
secs=${SECONDS_PER_RUN:-6}
: > "$log"
echo "# $(date -u +%FT%TZ) $(nproc) cores $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$log"

# serve <port> <flags...>: starts a server ($server_bin, default the bundle's gpukv-server) and waits until it
# answers health checks.
serve() {
  local port=$1
  shift
  "${server_bin:-$bundle/bin/gpukv-server}" --listen=127.0.0.1:"$port" --metrics_listen=127.0.0.1:0 --backend=gpu --log_level=warn "$@" \
    >>"$out/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 60); do
    "$bundle/bin/gpukv" --target=127.0.0.1:"$port" health >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server on $port did not come up" | tee -a "$log"
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
# The latest server's batch counters from its metrics port (no curl there: bash's /dev/tcp): how many
# batches, how large, how long each waited in the queue, was staged (columns copied in), executed (copies
# and kernels) and answered (results written into the calls).
batch_metrics() {
  local port
  port=$(grep -o 'metrics on port [0-9]*' "$out/server.log" | tail -1 | awk '{print $4}')
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 0
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  grep -E '^gpukv_(batch_size_ops|batch_(execution|staging|answer)_seconds|queue_delay_seconds)_(sum|count)|^gpukv_batches_total' <&3 | tee -a "$log"
  exec 3>&-
}
# The counters are cumulative: the difference between successive snapshots belongs to the run between them.
load_then_metrics() {
  load "$@"
  batch_metrics
}
