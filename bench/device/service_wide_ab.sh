#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: two gpukv-server builds at the server's default
# widths (16-byte keys, 128-byte values: a board whose values CopyValues copies), alternating for ROUNDS rounds
# (default 2), under loads that write as well as read, from four gpukv-load processes: BatchPut of new keys
# (text keys drawn from 10^12, a seed each) in calls of 10000 and of 1000, then over 8M keys BatchPut of 10000,
# BatchGet of 10000 and a 50/45/5 mix of 1000 a call.
# After each load, the batch metrics (the table's execution time per batch is what the builds change; the
# calls' rates follow staging and queueing as much). A variant is "name=binary", relative to the bundle's bin/:
#   bash bench/device/service_wide_ab.sh "before=gpukv-server.base" "after=gpukv-server"
# Logs to $OUT/service_wide_ab.log.
set -uo pipefail
log_name=service_wide_ab
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
source "$(dirname "$0")/service_lib.sh"

for round in $(seq 1 "${ROUNDS:-2}"); do
  for variant in "$@"; do
    name=${variant%%=*}
    server_bin=$bundle/bin/${variant#*=}
    # 2^28 slots of 16 + 128 bytes and their tickets, about 40 GB: room for the new keys of every load below at
    # their rates (at 2^27, the second load of new keys filled the table, and the loads after it were refused).
    serve 50096 --capacity=268435456 || continue
    echo "# round $round: $name (${variant#*=})" | tee -a "$log"
    t="--target=127.0.0.1:50096 --value_size=128 --processes=4"
    load_then_metrics $t --keys=1000000000000 --get=0 --put=1 --seed=1 --mode=batch --batch=10000 --callers=16
    load_then_metrics $t --keys=1000000000000 --get=0 --put=1 --seed=2 --mode=batch --batch=1000 --callers=32
    load_then_metrics $t --keys=8000000 --get=0 --put=1 --seed=3 --mode=batch --batch=10000 --callers=16
    load_then_metrics $t --keys=8000000 --get=1 --put=0 --seed=3 --mode=batch --batch=10000 --callers=16
    load_then_metrics $t --keys=8000000 --get=0.5 --put=0.45 --seed=3 --mode=batch --batch=1000 --callers=32
    kill -TERM "$server"
    wait "$server"
  done
done
