#!/usr/bin/env bash
# Runs on the lent GPU machine after bench/device/run.sh or service_gpu.sh unpacked the bundle: the GPU-backend
# server with and without --launch_when_idle, alternating, on the lines where a call's time in the batching
# pipeline matters (unary, 1000-key and 10000-key batches). Logs to $OUT/idle_launch_ab.log.
set -uo pipefail
bundle=.device/bundle
[[ -d $bundle ]] || tar xzf .device/bundle.tgz -C .device
export LD_LIBRARY_PATH=$bundle/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
log=$out/idle_launch_ab.log
echo "# $(date -u +%FT%TZ) $(nproc) cores $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$log"
for round in 1 2; do
  for idle in false true; do
    "$bundle/bin/gpukv-server" --listen=127.0.0.1:50096 --metrics_listen=127.0.0.1:0 --backend=gpu --log_level=warn \
      --capacity=67108864 --key_width=16 --value_width=8 --launch_when_idle=$idle >>"$out/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 60); do "$bundle/bin/gpukv" --target=127.0.0.1:50096 health >/dev/null 2>&1 && break; sleep 1; done
    echo "# round $round --launch_when_idle=$idle" | tee -a "$log"
    t="--target=127.0.0.1:50096 --keys=16000000 --seconds=5"
    "$bundle/bin/gpukv-load" $t --mode=batch --batch=1000 --callers=32 --get=0 --put=1 >/dev/null 2>&1
    for args in "--mode=unary --callers=128" "--mode=batch --batch=1000 --callers=32" "--mode=batch --batch=10000 --callers=16"; do
      "$bundle/bin/gpukv-load" $t $args --get=1 --put=0 2>/dev/null | tee -a "$log"
    done
    kill -TERM $server
    wait $server
  done
done
