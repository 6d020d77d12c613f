#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries here (sm_90) and gathers them, with the shared
# libraries they load, into .device/bundle, packed as .device/bundle.tgz (the binaries carry device code for
# every table type, about 20 MB each: packed, the bundle stays under the 64 MiB a call carries). git ignores
# it; the device tool carries it to the lent GPU machine, which has CUDA but none of our Debian libraries.
# Run bench/device/run.sh there (it unpacks the bundle).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-device
targets=${TARGETS:-"table_test table_bench_gpu host_tier_bench_gpu gpukv-server gpukv-load gpukv"}
# The lent GPUs are Hopper (sm_90): the bundle carries that code only, to stay under the 64 MiB a call carries.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$build" -j2 --target $targets

out=$root/.device/bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for t in $targets; do
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  cp "$bin" "$out/bin/"
  # Every library the binary loads except the C runtime and the CUDA driver, which the machine has.
  ldd "$bin" | awk '/=>/ {print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda)\.so' |
    xargs -r cp -L -t "$out/lib"
done
# Programs of this machine to run beside ours there (e.g. EXTRA_BINS="/usr/bin/redis-server /usr/bin/redis-benchmark"
# for a comparison in the same run), with their libraries.
for b in ${EXTRA_BINS:-}; do
  cp -L "$b" "$out/bin/$(basename "$b")"
  ldd "$b" | awk '/=>/ {print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda)\.so' |
    xargs -r cp -L -t "$out/lib"
done
# Tuning variants of the GPU benchmark (sm_90 only), e.g. VARIANTS="GPUKV_PROBE_MIN_BLOCKS=6".
for v in ${VARIANTS:-}; do
  name=${v#GPUKV_}
  vbuild=$root/build-device-$name
  cmake -S "$root" -B "$vbuild" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -D"$v" >/dev/null
  cmake --build "$vbuild" -j2 --target table_bench_gpu
  cp "$vbuild/bench/table_bench_gpu" "$out/bin/table_bench_gpu.$name"
done
tar czf "$root/.device/bundle.tgz" -C "$root/.device" bundle
du -sh "$out" "$root/.device/bundle.tgz"
