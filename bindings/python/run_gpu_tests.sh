#!/bin/sh
# Runs the Python binding's GPU tests (tests/test_gpu.py, torch and cupy
# device arrays on the CUDA backend) and its CPU tests on a GPU machine.
#
# Needs: the CUDA toolkit (nvcc, cudart, cuBLAS), meson, ninja, python3 with
# numpy, pytest, torch and cupy. SWIG is optional: without it, the wrapper
# sources must have been written beforehand with generate_wrapper.sh into
# bindings/python/pregenerated/ (carry that directory to the machine).
#
# Usage: bindings/python/run_gpu_tests.sh [build-dir] [gpu_arch, default sm_90a]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-python-gpu}
arch=${2:-sm_90a}

if ! command -v swig >/dev/null 2>&1; then
  if [ ! -f "$here/pregenerated/capi_wrap.c" ]; then
    echo "no swig and no $here/pregenerated: run generate_wrapper.sh where swig is installed" >&2
    exit 2
  fi
  (cd "$root" && sha256sum -c --quiet "$here/pregenerated/SOURCES.sha256") || {
    echo "the pregenerated wrapper is stale (header or capi.i changed): regenerate it" >&2
    exit 2
  }
fi

python3 -c "import numpy, pytest, torch, cupy" || {
  echo "python3 needs numpy, pytest, torch and cupy" >&2
  exit 2
}
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

if [ -d "$build" ]; then
  meson setup --reconfigure "$build" "$root" -Dcuda=enabled -Dgpu_arch="$arch" -Dpython=enabled
else
  meson setup "$build" "$root" -Dcuda=enabled -Dgpu_arch="$arch" -Dpython=enabled \
    -Dtests=false -Dexamples=false -Dbench=false -Dgo=disabled -Drust=disabled -Dabi_check=disabled
fi
ninja -C "$build"

PYTHONPATH="$build/bindings/python" python3 -m pytest -v -rs -p no:cacheprovider \
  "$here/tests/test_gpu.py" "$here/tests/test_cpu.py"
