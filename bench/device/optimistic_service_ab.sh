#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: one gpukv-server of 8-byte keys and values (whose
# device tier is a line, where the GPU may run passes of PUTs without grouping them: --optimistic_inserts),
# with that setting auto and off, alternating for ROUNDS rounds (default 2), under the loads it changes:
# BatchPut of new keys (binary keys drawn from 2^60, a seed of their own for each load) in calls of 10000
# and 1000 keys from four gpukv-load processes, then GETs and a 50/45/5 mix over 16M keys, which it must leave as they were. After each load, the
# batch metrics and the optimistic passes kept and redone. PUTS_ONLY=1: the loads of new keys alone. Logs to
# $OUT/optimistic_service_ab.log.
set -uo pipefail
log_name=optimistic_service_ab
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
source "$(dirname "$0")/service_lib.sh"

optimistic_passes() { scrape '^gpukv_optimistic_passes_total|^gpukv_items\{tier="device"\}'; }

for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in ${MODES:-auto off}; do
    # 2^29 slots (about 10 GB of line): room for the new keys of every load below at their rates.
    serve 50096 --capacity=536870912 --key_width=8 --value_width=8 --optimistic_inserts="$mode" || continue
    echo "# round $round: optimistic_inserts=$mode" | tee -a "$log"
    t="--target=127.0.0.1:50096 --key_format=binary --value_size=8"
    new="--keys=1152921504606846976 --get=0 --put=1"
    load_then_metrics $t $new --seed=1 --mode=batch --batch=10000 --callers=16 --processes=4
    optimistic_passes
    load_then_metrics $t $new --seed=2 --mode=batch --batch=1000 --callers=32 --processes=4
    optimistic_passes
    if [[ -z ${PUTS_ONLY:-} ]]; then
      load_then_metrics $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0
      optimistic_passes
      load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --processes=4 --get=0.5 --put=0.45
      optimistic_passes
    fi
    kill -TERM "$server"
    wait "$server"
  done
done
