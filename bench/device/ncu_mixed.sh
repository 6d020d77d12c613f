#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: where the warps of a mixed pass's two split kernels
# wait, beside the pure passes' kernels that run the same ops alone. Nsight Compute's warp-state, memory and
# source-counter sections for one launch each of, in table_bench_gpu --parts=table --n=134217728 --layouts=line
# --repeats=1 at one load: the lookup kernel of a find-hit pass, the Stash kernel of an overwrite pass, and the
# split kernels (GETs and deletes, then PUTs) of a pass of the mixed batch. Caches and clocks as they run.
#
# Launch indices, counted by kernel function over the benchmark's calls (insert, find hit, find miss,
# overwrite, mixed, delete; each call 33 passes of up to 4194304 ops but the mixed one, 17): lookup_kernel's
# first 30 launches are the find-hit passes after the call's two optimistic ones; stash_kernel is launched,
# returning at once, in each pass of the two find calls (64 launches) before the overwrite passes; the mixed
# call runs its first three passes in the clStash kernel, then split_kernel twice a pass. Each launch is
# checked by its duration in the output (an idle launch takes a few us).
#
# Per profile (lookup_hit, stash_overwrite, split: both split kernels): $OUT/mixed-<profile>-<load>.csv (the
# sections) and $OUT/mixed-<profile>-<load>-sass.csv (each SASS instruction's warp-stall samples, one block a
# kernel: bench/ncu_sass.py reads them). Usage: LOAD=0.9 [BENCH=table_bench_gpu.base] bench/device/ncu_mixed.sh
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
load=${LOAD:-0.9}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
bench="$bundle/bin/${BENCH:-table_bench_gpu} --parts=table --n=134217728 --loads=$load --layouts=line --repeats=1"
sections=(--section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats
          --section SpeedOfLight --section SchedulerStats --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables)
# tag, kernel function, launches skipped, launches profiled
for spec in "lookup_hit lookup_kernel 10 1" "stash_overwrite stash_kernel 74 1" "split split_kernel 12 2"; do
  read -r tag kernel skip count <<<"$spec"
  rep=/tmp/mixed-$tag
  "$ncu" --kernel-name-base function --kernel-name "regex:^$kernel\$" --launch-skip "$skip" --launch-count "$count" \
    --cache-control none --clock-control none "${sections[@]}" --import-source no -f -o "$rep" $bench >/dev/null 2>&1
  "$ncu" --import "$rep.ncu-rep" --page details --csv >"$out/mixed-$tag-$load.csv" 2>&1
  "$ncu" --import "$rep.ncu-rep" --page source --print-source sass --csv >"$out/mixed-$tag-$load-sass.csv" 2>&1
  echo "# $tag ($kernel, launches $skip + $count)"
  shown='Duration|Registers Per Thread|Achieved Active Warps Per SM|Warp Cycles Per Issued Instruction'
  shown+='|Issued Warp Per Scheduler|DRAM Throughput|L2 Hit Rate|L1/TEX Hit Rate'
  # The section CSV's row: ID, ..., metric name (13th field), unit, value, then the rest of the row.
  grep -E "\"($shown)\"" "$out/mixed-$tag-$load.csv" |
    awk -F'","' '{v = $15; sub(/".*/, "", v); print substr($1, 2) " " $13 " " v " " $14}' | sed 's/ *$//'
done
