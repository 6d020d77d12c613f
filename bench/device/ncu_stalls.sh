#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: where the warps of single passes wait. Nsight
# Compute's warp-state and source-counter sections for passes of table_bench_gpu (ncu_passes.sh names them:
# insert, find_hit, find_miss, overwrite, insert_group, overwrite_group). Per pass: $OUT/stalls-<tag>.csv
# (the sections: stall reasons in cycles per issued instruction, occupancy, registers) and
# $OUT/stalls-<tag>-sass.csv (the SASS of the kernel with each instruction's warp-stall samples, to name the
# instruction a pass waits on). Usage: LOAD=0.5 LAYOUT=board [BENCH=table_bench_gpu.base]
# bench/device/ncu_stalls.sh [pass...] (default: insert find_hit find_miss insert_group).
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/ncu_passes.sh"
passes=("$@")
[[ ${#passes[@]} -gt 0 ]] || passes=(insert find_hit find_miss insert_group)
for what in "${passes[@]}"; do
  select_pass "$what"
  rep=/tmp/stalls-$what
  "$ncu" "${sel[@]}" --section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats \
    --section SpeedOfLight --import-source no -f -o "$rep" $bench >/dev/null 2>&1
  tag=$what-$layout-$load${BENCH:+-$BENCH}
  "$ncu" --import "$rep.ncu-rep" --page details --csv >"$out/stalls-$tag.csv" 2>&1
  "$ncu" --import "$rep.ncu-rep" --page source --print-source sass --csv >"$out/stalls-$tag-sass.csv" 2>&1
  echo "# $what ($kernel launch $skip): $(wc -l <"$out/stalls-$tag-sass.csv") SASS lines"
  grep -E 'Stall|Registers Per|Achieved Occupancy|Duration' "$out/stalls-$tag.csv" | cut -d, -f13- | head -40
done
