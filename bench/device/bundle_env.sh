# Sourced first by the scripts that run on the lent GPU machine, from the repository root: the bundle
# (make_bundle.sh) unpacked, its libraries on the loader's path, and $out (the device tool's $OUT) made.
bundle=${BUNDLE:-.device/bundle}
[[ -d $bundle ]] || tar xzf .device/bundle.tgz -C .device
export LD_LIBRARY_PATH=$bundle/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
