#!/bin/sh
# The core library depends on the C and C++ runtimes only: no CUDA library
# among its NEEDED entries (the CUDA backend is a module it loads).
#   check_core_needs.sh READELF LIBRARY
set -eu
needed=$("$1" -d "$2" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$2 needs: $(echo $needed)"
bad=$(echo "$needed" | grep -E 'cuda|cublas|nvidia' || true)
if [ -n "$bad" ]; then
  echo "FAIL: the core library needs $bad"
  exit 1
fi
