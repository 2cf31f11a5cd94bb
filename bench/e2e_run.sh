#!/bin/bash
# Builds the Python binding with the CUDA backend and runs bench/e2e_step.py
# on a GPU machine:
#   bench/e2e_run.sh BUILD_DIR OUT_DIR [e2e_step.py args...]
# writes OUT_DIR/e2e-CARD-DATE.json and .log (CARD: h100, h200, ... from
# nvidia-smi). GPU_ARCH (default sm_90a) is the CUDA target.
#
# Needs nvcc, cuBLAS, meson, ninja and python3 with torch, numpy and scipy
# (Triton for the standard sampler's kernels). Without swig, the wrapper
# sources come from bindings/python/pregenerated/ (generate_wrapper.sh,
# run where swig is installed; carry that directory to the machine).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1
out=$2
shift 2
arch=${GPU_ARCH:-sm_90a}
mkdir -p "$out"

if ! command -v swig >/dev/null 2>&1; then
  (cd "$root" && sha256sum -c --quiet bindings/python/pregenerated/SOURCES.sha256) || {
    echo "no swig, and bindings/python/pregenerated/ is missing or stale: run generate_wrapper.sh" >&2
    exit 2
  }
fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dcuda=enabled -Dgpu_arch="$arch" -Dpython=enabled \
    -Dtests=false -Dexamples=false -Dbench=false -Dgo=disabled -Drust=disabled -Dabi_check=disabled
fi
ninja -C "$build"

card=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -1 |
  (grep -oE '[AHBL][0-9]+' || true) | head -1 | tr 'A-Z' 'a-z')
name="e2e-${card:-gpu}-$(date +%Y-%m-%d)"
PYTHONPATH="$build/bindings/python" PYTHONUNBUFFERED=1 python3 "$root/bench/e2e_step.py" \
  --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
