#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: Nsight Compute on single passes of table_bench_gpu
# (ncu_passes.sh says which), one kernel launch per line: the probing step (stash_kernel) of the last full
# insert pass, of a find-hit, a find-miss and an overwrite pass, and the grouping step (GroupOp) of the
# insert and the overwrite pass. Those passes hold 4194304 ops, so the DRAM bytes per op are dram__bytes /
# 4194304. Usage: LOAD=0.5 LAYOUT=board bench/device/ncu_steps.sh; logs to $OUT/ncu-<layout>-<load>.csv.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/ncu_passes.sh"
csv=$out/ncu-$layout-$load.csv
: >"$csv"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
for what in insert find_hit find_miss overwrite insert_group overwrite_group; do
  select_pass "$what"
  echo "# $what: $kernel launch $skip" | tee -a "$csv"
  "$ncu" "${sel[@]}" --metrics "$metrics" --csv $bench 2>&1 | grep -E '^"' | tee -a "$csv" | cut -c1-60 | tail -2
done
