#!/bin/sh
# Another Go module uses the binding as bindings/README.md says: the README's
# go.mod block (its placeholder path replaced by this checkout's
# bindings/go), a main package in a temporary directory importing
# github.com/flashspec/flashspec/bindings/go, built offline with only
# PKG_CONFIG_PATH set, then run and its output checked.
#   check_external_module.sh BUILD_DIR SOURCE_ROOT
# Exit 77 (meson's skip) without go or swig.
set -eu
build=$(cd "$1" && pwd)
root=$(cd "$2" && pwd)
command -v go >/dev/null 2>&1 || { echo "SKIP: go is not installed"; exit 77; }
command -v swig >/dev/null 2>&1 || command -v swig4.0 >/dev/null 2>&1 ||
  { echo "SKIP: swig is not installed (go build runs it on internal/capi)"; exit 77; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The go.mod of bindings/README.md ("Using it from another module").
python3 - "$root/bindings/README.md" "$root/bindings/go" "$scratch/go.mod" <<'PY'
import re, sys
readme, binding, out = sys.argv[1:]
blocks = re.findall(r"```go\.mod\n(.*?)```", open(readme, encoding="utf-8").read(), re.S)
if len(blocks) != 1:
    sys.exit(f"FAIL: {len(blocks)} go.mod blocks in bindings/README.md, want 1")
placeholder = "/path/to/flashspec/bindings/go"
if blocks[0].count(placeholder) != 1 or "replace github.com/flashspec/flashspec/bindings/go =>" not in blocks[0]:
    sys.exit(f"FAIL: the README's go.mod has no replace directive to {placeholder}")
open(out, "w").write(blocks[0].replace(placeholder, binding))
PY
cat > "$scratch/main.go" <<'GO'
package main

import (
	"errors"
	"fmt"

	flashspec "github.com/flashspec/flashspec/bindings/go"
)

func main() {
	ctx, err := flashspec.NewContext(&flashspec.ContextOptions{Backend: flashspec.BackendCPU, Seed: 1})
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	// W is [V = 4, d = 2]; hidden (0, 3) scores token 1 highest.
	head, err := ctx.NewLMHead([]float32{1, 0, 0, 1, -1, 0, 0, -1}, 4, 2)
	if err != nil {
		panic(err)
	}
	defer head.Close()
	tokens, _, err := ctx.Draft(head, []float32{0, 3}, nil)
	if err != nil {
		panic(err)
	}
	_, _, err = ctx.Draft(head, []float32{0, 3}, &flashspec.DraftOptions{Temperatures: []float32{}})
	fmt.Println("draft:", tokens, "version:", flashspec.Version(), "short slice:", errors.Is(err, flashspec.ErrOutOfRange))
}
GO
cat "$scratch/go.mod"
cd "$scratch"
export PKG_CONFIG_PATH="$build/meson-uninstalled"
export GOPROXY=off GOFLAGS= GOCACHE="$build/bindings/go/cache"
go build -o hello . || { echo "FAIL: the external module does not build"; exit 1; }
out=$(LD_LIBRARY_PATH="$build/src" ./hello)
echo "$out"
[ "$out" = "draft: [1] version: $(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$root/meson.build") short slice: true" ] || {
  echo "FAIL: unexpected output"; exit 1; }
echo "external module: builds against the binding through its replace directive and runs"
