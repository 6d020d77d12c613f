#!/usr/bin/env bash
# Runs on a lent machine with two GPUs from the repository root: the cluster with one server per GPU
# (CUDA_VISIBLE_DEVICES), each --shard_count=2, driven by sharded gpukv-load processes on the same host,
# beside one server on one GPU driven by the plain client, alternated over two rounds; two independent
# servers, one per GPU, each under its own plain-client load (what the host carries without the split);
# then the same load against one and two transport_ceiling_servers (the API with no table: what gRPC carries
# on this host). Each line has keys/s and p99, each server's cores and batch execution time, each GPU's
# utilization, the load processes' cores and the host's busy cores.
# ROUNDS (default 2) sets the rounds; QUICK=1 keeps the two GET shapes only, for a short lease.
# Logs to $OUT/two_gpu.log.
set -uo pipefail
log_name=two_gpu
source "$(dirname "$0")/service_lib.sh"
nvidia-smi topo -m 2>&1 | tee -a "$log"

keys=--keys=32000000
table="--capacity=67108864 --key_width=16 --value_width=8"
shapes=(
  "--mode=batch --batch=1000 --callers=64 --processes=8 --get=1 --put=0"
  "--mode=batch --batch=10000 --callers=32 --processes=8 --get=1 --put=0"
  "--mode=batch --batch=1000 --callers=64 --processes=8 --get=0 --put=1"
  "--mode=batch --batch=10000 --callers=32 --processes=8 --get=0 --put=1"
  "--mode=batch --batch=1000 --callers=64 --processes=8 --get=0.5 --put=0.45"
  "--mode=batch --batch=10000 --callers=32 --processes=8 --get=0.5 --put=0.45"
)

[[ ${QUICK:-0} == 1 ]] && shapes=("${shapes[@]:0:2}")

for round in $(seq 1 "${ROUNDS:-2}"); do
  echo "# round $round: one server, GPU 0, plain client" | tee -a "$log"
  if start_shard 50201 0 $table; then
    load --target=127.0.0.1:50201 $keys --mode=batch --batch=10000 --callers=32 --processes=8 --get=0 --put=1
    for shape in "${shapes[@]}"; do measure "one-gpu-r$round" --target=127.0.0.1:50201 $keys $shape; done
  fi
  stop_shards
  echo "# round $round: two servers, GPU 0 and GPU 1, sharded client" | tee -a "$log"
  if start_shard 50211 0 $table --shard_count=2 --shard_index=0 && start_shard 50212 1 $table --shard_count=2 --shard_index=1; then
    t=--targets=127.0.0.1:50211,127.0.0.1:50212
    load $t $keys --mode=batch --batch=10000 --callers=32 --processes=8 --get=0 --put=1
    for shape in "${shapes[@]}"; do measure "two-gpus-r$round" $t $keys $shape; done
  fi
  stop_shards
done

# What two GPUs carry on this host without the client's split: two independent servers (one per GPU, no
# shards), each driven by its own plain-client load with half the callers and processes, at once.
echo "# two independent servers, one plain-client load each, at once" | tee -a "$log"
if start_shard 50231 0 $table && start_shard 50232 1 $table; then
  fill=()
  for port in 50231 50232; do
    load --target=127.0.0.1:$port $keys --mode=batch --batch=10000 --callers=16 --processes=4 --get=0 --put=1 &
    fill+=($!)
  done
  wait "${fill[@]}"
  for shape in "--mode=batch --batch=1000 --callers=32 --processes=4 --get=1 --put=0" \
               "--mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0"; do
    echo "# $shape, on each" | tee -a "$log"
    h0=$(host_busy_s)
    t0=$(date +%s%N)
    load --target=127.0.0.1:50231 $keys $shape &
    first=$!
    load --target=127.0.0.1:50232 $keys $shape
    wait $first
    awk -v b0="$h0" -v b1="$(host_busy_s)" -v ns="$(($(date +%s%N) - t0))" -v n="$(nproc)" \
      'BEGIN {printf "HOST independent busy_cores=%.2f of %d\n", (b1 - b0) * 1e9 / ns, n}' | tee -a "$log"
  done
fi
stop_shards

# The transport's ceiling on this host: the GET lines against one no-table server, then two, the second
# through the sharded client as above; the load processes' and servers' CPU is all the host has.
for n in 1 2; do
  echo "# $n transport_ceiling_server(s)" | tee -a "$log"
  pids=()
  targets=
  for ((i = 0; i < n; ++i)); do
    "$bundle/bin/transport_ceiling_server" --listen=127.0.0.1:$((50221 + i)) >>"$out/server.log" 2>&1 &
    pids+=($!)
    targets+=${targets:+,}127.0.0.1:$((50221 + i))
  done
  sleep 1
  for shape in "${shapes[@]:0:2}"; do load --targets="$targets" $keys $shape; done
  kill -TERM "${pids[@]}"
  wait "${pids[@]}"
done
