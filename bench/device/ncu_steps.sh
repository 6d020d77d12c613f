#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: Nsight Compute on single passes of table_bench_gpu
# (8 B / 8 B, n = 2^27, one load, one repeat), one kernel launch per line: the probing step (stash_kernel) of
# the last full insert pass, of a find-hit pass, of a find-miss pass and of an overwrite pass, and the
# grouping step (GroupOp) of the last full insert pass and of an overwrite pass. Those passes hold 4194304
# ops (max_batch), so the DRAM bytes per op are dram__bytes / 4194304. At load 0.5 the fill is 32 full
# passes and one of 140 ops (pass 32). Usage: LOAD=0.5 LAYOUT=board bench/device/ncu_steps.sh; logs to
# $OUT/ncu-<layout>-<load>.csv.
#
# stash_kernel launches at load 0.5: insert passes 0-32, find hit 33-65, find miss 66-98, overwrite 99-131
# (the mixed batch runs on clstash_kernel). GroupOp launches: insert passes 0-32 (read-only passes return
# at once and are launched too: 33-98), overwrite 99-131.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
load=${LOAD:-0.5}
layout=${LAYOUT:-board}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
bench="$bundle/bin/table_bench_gpu --parts=table --n=134217728 --loads=$load --layouts=$layout --repeats=1"
csv=$out/ncu-$layout-$load.csv
: >"$csv"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
for spec in "insert stash_kernel 31" "find_hit stash_kernel 40" "find_miss stash_kernel 70" "overwrite stash_kernel 110" \
            "insert_group GroupOp 31" "overwrite_group GroupOp 110"; do
  read -r what kernel skip <<<"$spec"
  echo "# $what: $kernel launch $skip" | tee -a "$csv"
  if [[ $kernel == stash_kernel ]]; then
    sel=(--kernel-name-base function --kernel-name "regex:^stash_kernel")
  else
    sel=(--kernel-name-base demangled --kernel-name "regex:GroupOp")
  fi
  "$ncu" "${sel[@]}" --launch-skip "$skip" --launch-count 1 --metrics "$metrics" --csv $bench 2>&1 |
    grep -E '^"' | tee -a "$csv" | cut -c1-60 | tail -2
done
