# Sourced by the Nsight Compute scripts (ncu_steps.sh, ncu_stalls.sh) after bundle_env.sh: the benchmark
# they profile and which kernel launch is which pass, kept here once.
#
# table_bench_gpu --parts=table --n=134217728 --loads=$LOAD --layouts=$LAYOUT --repeats=1, 8 B / 8 B. Its
# passes hold 4194304 ops (max_batch); at load 0.5 the fill is 32 full passes and one of 140 ops (pass 32).
# stash_kernel launches at load 0.5: insert passes 0-32, find hit 33-65, find miss 66-98, overwrite 99-131
# (the mixed batch runs on clstash_kernel). GroupOp launches: insert passes 0-32 (read-only passes launch
# it too: 33-98), overwrite 99-131. BENCH names another benchmark binary of the bundle (a baseline).
load=${LOAD:-0.5}
layout=${LAYOUT:-board}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
bench="$bundle/bin/${BENCH:-table_bench_gpu} --parts=table --n=134217728 --loads=$load --layouts=$layout --repeats=1"

# pass name -> "kernel launch": the last full insert pass, a find-hit, a find-miss and an overwrite pass, and
# the grouping step of the insert and of the overwrite pass.
declare -A pass_launch=(
  [insert]="stash_kernel 31" [find_hit]="stash_kernel 40" [find_miss]="stash_kernel 70"
  [overwrite]="stash_kernel 110" [insert_group]="GroupOp 31" [overwrite_group]="GroupOp 110"
)

# Sets `kernel`, `skip` and `sel` (ncu's kernel filter and launch) for pass $1.
select_pass() {
  read -r kernel skip <<<"${pass_launch[$1]}"
  if [[ $kernel == stash_kernel ]]; then
    sel=(--kernel-name-base function --kernel-name "regex:^stash_kernel")
  else
    sel=(--kernel-name-base demangled --kernel-name "regex:GroupOp")
  fi
  sel+=(--launch-skip "$skip" --launch-count 1)
}
