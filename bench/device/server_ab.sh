#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: two gpukv-server variants on the GPU backend,
# alternating for ROUNDS rounds (default 2), on the lines where a call's time in the batching pipeline
# matters: unary, 1000- and 10000-key batches and streamed groups of 64 from one gpukv-load process, and the
# same batches from four (with the cores each kind of server thread used, and the batch metrics). A variant
# is "name=binary flags...", the binary relative to the bundle's bin/; e.g.
#   bash bench/device/server_ab.sh "before=gpukv-server.before" "after=gpukv-server"
#   bash bench/device/server_ab.sh "off=gpukv-server --launch_when_idle=false" "on=gpukv-server --launch_when_idle=true"
# Logs to $OUT/server_ab.log.
set -uo pipefail
log_name=server_ab
source "$(dirname "$0")/service_lib.sh"

for round in $(seq 1 "${ROUNDS:-2}"); do
  for variant in "$@"; do
    name=${variant%%=*}
    read -r binary flags <<<"${variant#*=}"
    server_bin=$bundle/bin/$binary
    # shellcheck disable=SC2086  # the variant's flags are words
    serve 50096 --capacity=67108864 --key_width=16 --value_width=8 $flags || continue
    echo "# round $round: $name ($binary $flags)" | tee -a "$log"
    t="--target=127.0.0.1:50096 --keys=16000000"
    "$bundle/bin/gpukv-load" $t --seconds=4 --mode=batch --batch=1000 --callers=32 --get=0 --put=1 >/dev/null 2>&1
    load_then_metrics $t --mode=unary --callers=128 --get=1 --put=0
    load_then_metrics $t --mode=batch --batch=1000 --callers=32 --get=1 --put=0
    load_then_metrics $t --mode=batch --batch=10000 --callers=16 --get=1 --put=0
    load_then_metrics $t --mode=stream --batch=64 --callers=32 --depth=8 --get=1 --put=0
    cpu_of "$name-batch1000" load $t --mode=batch --batch=1000 --callers=32 --processes=4 --get=1 --put=0
    batch_metrics
    cpu_of "$name-batch10000" load $t --mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0
    batch_metrics
    kill -TERM "$server"
    wait "$server"
  done
done
