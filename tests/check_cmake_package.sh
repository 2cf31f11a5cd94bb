#!/bin/sh
# Installs the build into a scratch prefix and builds and runs a CMake
# project that uses find_package(flashspec).
#   check_cmake_package.sh BUILD_DIR SOURCE_ROOT
set -eu
build=$1
source=$2
command -v cmake >/dev/null 2>&1 || { echo "SKIP: cmake is not installed"; exit 77; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
meson install -C "$build" --no-rebuild --destdir "$scratch/root" > "$scratch/install.log"
config=$(find "$scratch/root" -name flashspecConfig.cmake | head -1)
[ -n "$config" ] || { echo "FAIL: no flashspecConfig.cmake installed"; exit 1; }
prefix_dir=$(cd "$(dirname "$config")/../../../.." && pwd)
cmake -S "$source/tests/cmake_consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$prefix_dir" > "$scratch/cmake.log"
cmake --build "$scratch/consumer" > "$scratch/build.log"
"$scratch/consumer/consumer"
