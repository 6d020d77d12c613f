#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root:
# gpukv-server on the GPU backend, driven by gpukv-load from the same machine over 127.0.0.1, in the shapes
# of bench/service_bench.sh; the main lines again with the calls answered on the execution thread
# (--completion_threads=0); the same lines against transport_ceiling_server (the API with no table: what
# gRPC allows on this machine), plain and answering from other threads as gpukv-server must; and a
# host-tier server that must spill. Logs to $OUT/service_gpu.log.
set -uo pipefail
log_name=service_gpu
source "$(dirname "$0")/service_lib.sh"

# The device tier only: 16-byte keys, 8-byte values, 64 M slots.
if serve 50091 --capacity=67108864 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50091
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1   # fills part of the table
  load_then_metrics $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=100 --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0.5 --put=0.45
  load_then_metrics $t --keys=16000000 --mode=stream --batch=64 --callers=16 --depth=8 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# The same server with every call answered by the execution thread (the server's choice below 8 cores).
if serve 50093 --capacity=67108864 --key_width=16 --value_width=8 --completion_threads=0; then
  t=--target=127.0.0.1:50093
  echo "# --completion_threads=0" | tee -a "$log"
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  load_then_metrics $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# The same server driven by four load processes at once (gpukv-load --processes=4), with as many callers in
# all as the lines above.
if serve 50095 --capacity=67108864 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50095
  echo "# four gpukv-load processes" | tee -a "$log"
  load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  cpu_of gpukv-batch1000 load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --processes=4 --get=1 --put=0
  cpu_of gpukv-batch10000 load $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# ceiling <label> <port> <flags...>: the lines above against transport_ceiling_server (the API with no table
# behind it), started with the flags; per-thread CPU under the "<label>-" names.
ceiling() {
  local label=$1 port=$2
  shift 2
  "$bundle/bin/transport_ceiling_server" --listen=127.0.0.1:"$port" "$@" >>"$out/server.log" 2>&1 &
  server=$!
  sleep 1
  echo "# transport_ceiling_server${*:+ $*}" | tee -a "$log"
  t=--target=127.0.0.1:$port
  load $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
  load $t --keys=16000000 --mode=batch --batch=100 --callers=128 --get=1 --put=0
  load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
  load $t --keys=16000000 --mode=stream --batch=64 --callers=16 --depth=8 --get=1 --put=0
  echo "# the same, four gpukv-load processes" | tee -a "$log"
  cpu_of "$label-batch1000" load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --processes=4 --get=1 --put=0
  cpu_of "$label-batch10000" load $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --processes=4 --get=1 --put=0
  kill -TERM $server
  wait $server
}
# The transport's ceiling: the same load against the API with no table behind it; then the same answered as
# gpukv-server answers calls: queued by the handler, finished by four other threads (the server's answer
# threads on 16 cores) in batches timed like its 200 us queue delay.
ceiling ceiling 50094
ceiling hop 50097 --answer_delay_us=200 --answer_threads=4

# A tiny device tier (1 M slots) under a 16 M-slot host tier: the data set lives mostly in host memory.
if serve 50092 --capacity=1048576 --host_capacity=16777216 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50092
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=0.5 --put=0.45
  "$bundle/bin/gpukv" --target=127.0.0.1:50092 stats 2>&1 | tee -a "$log"
  kill -TERM $server
  wait $server
fi
