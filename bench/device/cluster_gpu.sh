#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: cluster mode with one GPU. Logs to
# $OUT/cluster_gpu.log.
# 1. What the sharded client costs: one server (--shard_count=1), driven through the plain client
#    (gpukv-load --target) and through the sharded client given that one shard (--targets), alternated over
#    two rounds, in each shape below, with the cores the load processes used (the client's CPU per key).
# 2. How the aggregate scales: 1, 2 and 4 servers sharing the GPU (--shard_count=N, the same 64 M slots split
#    between them), driven by sharded gpukv-load; each server's CPU and batch execution time beside each line.
# PARTS="2" runs only the second; MPS=1 runs the servers under the CUDA Multi-Process Service (one GPU
# context shared by the processes instead of time slices); LOG_NAME names the log.
set -uo pipefail
log_name=${LOG_NAME:-cluster_gpu}
source "$(dirname "$0")/service_lib.sh"
parts=${PARTS:-1 2}
if [[ ${MPS:-0} == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "# under MPS" | tee -a "$log" || { echo "# MPS did not start" | tee -a "$log"; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi

keys=--keys=16000000
table="--key_width=16 --value_width=8"
shapes=(
  "--mode=batch --batch=1000 --callers=32 --processes=4 --get=1 --put=0"
  "--mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0"
  "--mode=batch --batch=1000 --callers=32 --processes=4 --get=0.5 --put=0.45"
  "--mode=unary --callers=128 --processes=4 --get=1 --put=0"
  "--mode=stream --batch=64 --depth=8 --callers=16 --processes=4 --get=1 --put=0"
)

# 1. One shard, plain against sharded client.
client_cost() {
  echo "# 1. one shard: plain client (--target) against the sharded client (--targets), two rounds" | tee -a "$log"
  start_shard 50101 0 --capacity=67108864 $table || return
  load --target=127.0.0.1:50101 $keys --mode=batch --batch=1000 --callers=32 --processes=4 --get=0 --put=1
  for round in 1 2; do
    for shape in "${shapes[@]}"; do
      measure "r$round-plain" --target=127.0.0.1:50101 $keys $shape
      measure "r$round-sharded" --targets=127.0.0.1:50101 $keys $shape
    done
  done
  stop_shards
}

# 2. N servers sharing the GPU.
sharing() {
  echo "# 2. N servers sharing the GPU, sharded gpukv-load" | tee -a "$log"
  local n i ports targets shape
  for n in 1 2 4; do
    echo "# $n servers" | tee -a "$log"
    ports=()
    for ((i = 0; i < n; ++i)); do
      start_shard $((50111 + i)) 0 --capacity=$((67108864 / n)) $table --shard_count=$n --shard_index=$i || break
      ports+=($((50111 + i)))
    done
    ((${#ports[@]} == n)) || { stop_shards; continue; }
    targets=--targets=$(printf '127.0.0.1:%s,' "${ports[@]}")
    targets=${targets%,}
    load "$targets" $keys --mode=batch --batch=1000 --callers=32 --processes=4 --get=0 --put=1
    for shape in "${shapes[@]:0:3}"; do
      measure "n=$n" "$targets" $keys $shape
    done
    stop_shards
  done
}

[[ " $parts " == *" 1 "* ]] && client_cost
[[ " $parts " == *" 2 "* ]] && sharing
exit 0
