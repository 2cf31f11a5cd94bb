#!/bin/sh
# Writes the SWIG-generated Python wrapper (capi_wrap.c, capi.py) into
# bindings/python/pregenerated/ (or $1), for building the Python binding on a
# machine without SWIG: Meson uses that directory when swig is missing.
# A stamp records the header's checksum; run_gpu_tests.sh refuses a stale one.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/pregenerated}
mkdir -p "$out"
swig -python -threads -I"$root/include" -outdir "$out" -o "$out/capi_wrap.c" "$here/flashspec/capi.i"
sha256sum "$root/include/flashspec.h" "$here/flashspec/capi.i" | sed "s|$root/||" > "$out/SOURCES.sha256"
echo "wrote $out/capi_wrap.c, $out/capi.py"
