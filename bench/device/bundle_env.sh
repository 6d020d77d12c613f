# Sourced first by the scripts that run on the lent GPU machine, from the repository root: the bundle
# (make_bundle.sh) unpacked, its libraries on the loader's path, and $out (the device tool's $OUT) made.
# A warm machine keeps the bundle unpacked by an earlier call: it is unpacked again whenever the carried
# .device/bundle.tgz differs from the one it came from (a stale bundle once ran an old build's binaries).
bundle=${BUNDLE:-.device/bundle}
if [[ -z ${BUNDLE:-} && -f .device/bundle.tgz ]]; then
  sum=$(md5sum .device/bundle.tgz | cut -d' ' -f1)
  if [[ ! -d $bundle || $(cat "$bundle/.unpacked-from" 2>/dev/null) != "$sum" ]]; then
    rm -rf "$bundle"
    tar xzf .device/bundle.tgz -C .device
    echo "$sum" >"$bundle/.unpacked-from"
  fi
fi
export LD_LIBRARY_PATH=$bundle/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
