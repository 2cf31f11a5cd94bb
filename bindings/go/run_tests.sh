#!/bin/sh
# go test of the Go binding against a Meson build tree, offline (standard
# library and cgo only): run_tests.sh BUILD_DIR [SOURCE_ROOT]
set -eu
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=${2:-$(cd "$here/../.." && pwd)}
# The uninstalled flashspec.pc gives the library; the header is in include/.
export PKG_CONFIG_PATH="$build/meson-uninstalled${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CGO_CFLAGS="-I$root/include ${CGO_CFLAGS:-}"
export CGO_LDFLAGS="-Wl,-rpath,$build/src ${CGO_LDFLAGS:-}"
export GOPROXY=off GOFLAGS=-mod=mod GOCACHE="$build/bindings/go/cache"
# go's build cache keys the SWIG package on capi.swig alone, not on the
# header it includes: a changed header would build against a stale wrapper.
# Start from an empty cache whenever the header changes.
stamp="$build/bindings/go/cache.header"
sum=$(cksum < "$root/include/flashspec.h")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sum" ]; then
  go clean -cache
  echo "$sum" > "$stamp"
fi
cd "$here"
go vet .
exec go test -count=1 ./...
