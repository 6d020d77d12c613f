#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: where the warps of single passes wait. Nsight
# Compute's warp-state and source-counter sections for the probing step of the last full insert pass and of
# a find-hit and a find-miss pass, and for the grouping step of the insert pass (launch numbers as in ncu_steps.sh, 8 B / 8 B,
# n = 2^27, one load). Per pass: $OUT/stalls-<what>.csv (the sections: stall reasons in cycles per issued
# instruction, occupancy, registers) and $OUT/stalls-<what>-sass.csv (the SASS of the kernel with each
# instruction's warp-stall samples, to name the instruction a pass waits on). Usage: LOAD=0.5
# LAYOUT=board bench/device/ncu_stalls.sh [what...] (what: insert, find_hit, find_miss, insert_group; default
# all). BENCH names another benchmark binary of the bundle (a baseline).
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
load=${LOAD:-0.5}
layout=${LAYOUT:-board}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
bench="$bundle/bin/${BENCH:-table_bench_gpu} --parts=table --n=134217728 --loads=$load --layouts=$layout --repeats=1"
specs=("insert stash_kernel 31" "find_hit stash_kernel 40" "find_miss stash_kernel 70" "insert_group GroupOp 31")
wanted=("$@")
for spec in "${specs[@]}"; do
  read -r what kernel skip <<<"$spec"
  if [[ ${#wanted[@]} -gt 0 && ! " ${wanted[*]} " =~ " $what " ]]; then continue; fi
  if [[ $kernel == stash_kernel ]]; then
    sel=(--kernel-name-base function --kernel-name "regex:^stash_kernel")
  else
    sel=(--kernel-name-base demangled --kernel-name "regex:GroupOp")
  fi
  rep=/tmp/stalls-$what
  "$ncu" "${sel[@]}" --launch-skip "$skip" --launch-count 1 --section WarpStateStats --section SourceCounters \
    --section Occupancy --section LaunchStats --section SpeedOfLight --import-source no -f -o "$rep" $bench >/dev/null 2>&1
  tag=$what-$layout-$load${BENCH:+-$BENCH}
  "$ncu" --import "$rep.ncu-rep" --page details --csv >"$out/stalls-$tag.csv" 2>&1
  "$ncu" --import "$rep.ncu-rep" --page source --print-source sass --csv >"$out/stalls-$tag-sass.csv" 2>&1
  echo "# $what ($kernel launch $skip): $(wc -l <"$out/stalls-$tag-sass.csv") SASS lines"
  grep -E 'Stall|Registers Per|Achieved Occupancy|Duration' "$out/stalls-$tag.csv" | cut -d, -f13- | head -40
done
