#!/bin/sh
# cargo test of flashspec-sys and flashspec against a Meson build tree,
# offline and without external crates: run_tests.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
export PKG_CONFIG_PATH="$build/meson-uninstalled${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$build/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CARGO_TARGET_DIR="$build/bindings/rust/target"
exec cargo test --offline --manifest-path "$here/Cargo.toml" --workspace
