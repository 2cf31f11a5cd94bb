#!/bin/sh
# ABI gate: compares the ABI of a built libflashspec.so with the checked-in
# baseline abi/libflashspec.abi (libabigail's abidw / abidiff).
#
#   abi/check_abi.sh [LIB]            check; fails only on an incompatible change
#   abi/check_abi.sh --update [LIB]   refresh the baseline from LIB (after a
#                                     compatible addition, or a SONAME bump)
#
# Without LIB, the library is built with debug information (abidw reads
# the types from DWARF; a release build has none) in $FLASHSPEC_ABI_BUILD
# (default build-abi/). A LIB given must carry debug info (-Ddebug=true).
#
# abidiff's exit status is a bit field: 1 error, 2 usage error, 4 ABI change,
# 8 incompatible ABI change. Additions (new functions, appended fields of
# struct_size-versioned structs seen as additions) set only bit 4: reported,
# passing. Bit 8 (removed or changed functions, reordered or resized fields
# of public structs, changed enum values) fails.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
baseline="$here/libflashspec.abi"
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
lib=${1:-}

for tool in abidw abidiff; do
  command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool not found (apt-get install abigail-tools)"; exit 77; }
done

if [ -z "$lib" ]; then
  build=${FLASHSPEC_ABI_BUILD:-$root/build-abi}
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" -Dbuildtype=debugoptimized -Dcuda=disabled -Dtests=false \
      -Dexamples=false -Dbench=false -Dpython=disabled -Dgo=disabled -Drust=disabled >/dev/null
  fi
  ninja -C "$build" >/dev/null
  lib="$build/src/libflashspec.so"
fi
lib=$(readlink -f "$lib")
if ! readelf -S "$lib" | grep -q '\.debug_info'; then
  echo "FAIL: $lib has no debug information; build it with -Ddebug=true (or run without LIB)"
  exit 1
fi

current=$(mktemp)
trap 'rm -f "$current"' EXIT
abidw --no-corpus-path --headers-dir "$root/include" --drop-private-types --out-file "$current" "$lib"

if [ $update = 1 ]; then
  cp "$current" "$baseline"
  echo "baseline refreshed: $baseline ($(grep -c '<elf-symbol ' "$baseline") ELF symbols); commit it"
  exit 0
fi

[ -f "$baseline" ] || { echo "FAIL: no baseline $baseline; create it with --update"; exit 1; }

soname_of() { sed -n 's/.*soname=.\([^"'"'"']*\).*/\1/p' "$1" | head -1; }
if [ "$(soname_of "$baseline")" != "$(soname_of "$current")" ]; then
  echo "FAIL: SONAME $(soname_of "$current") differs from the baseline's $(soname_of "$baseline")."
  echo "An intentional SONAME bump is done with abi/check_abi.sh --update (see abi/README.md)."
  exit 1
fi

# Structs that may grow: those whose first member is uint32_t struct_size
# (appending fields is the documented way to extend them). All others, such
# as flashspec_tensor, are frozen.
growable=$(awk '/typedef struct [a-z_]+ *\{/ { name = $3; getline; if ($0 ~ /struct_size/) print name }' \
  "$root/include/flashspec.h" | tr '\n' ' ')

set +e
abidiff --no-added-syms "$baseline" "$current" > "$current.report" 2>&1
rc=$?
set -e
cat "$current.report"

# abidiff sets bit 8 only for removed symbols; a reordered field or a
# changed type sets bit 4 like an addition does. So the report is classified:
# with added functions left out, the only changes allowed are members
# appended to growable structs and enumerators added. A "return type
# changed" or "parameter ... changed" header only introduces the details
# below it (a growable struct reached through a returned pointer grows, say),
# and each harmful detail has its own line: a name, offset, value or size.
harmful=$(awk -v growable=" $growable " '
  match($0, /type .struct [a-z_0-9]+/) { s = substr($0, RSTART, RLENGTH); sub(/.*struct /, "", s); current = s }
  /offset changed|deletion|value changed|name changed|parameter [0-9]+ of type .* was (added|removed)/ { print; next }
  /type size changed from|data member insertion/ {
    if (index(growable, " " current " ") == 0) print "in " current ": " $0
  }' "$current.report")
rm -f "$current.report"

if [ $((rc & 3)) -ne 0 ]; then
  echo "FAIL: abidiff could not compare (exit $rc)"
  exit 1
fi
if [ $((rc & 8)) -ne 0 ] || [ -n "$harmful" ]; then
  [ -n "$harmful" ] && printf 'incompatible changes:\n%s\n' "$harmful"
  echo "FAIL: incompatible ABI change against abi/libflashspec.abi (abidiff exit $rc)"
  exit 1
fi
added=$(abidiff "$baseline" "$current" | grep -c "^  \[A\]" || true)
if [ $((rc & 4)) -ne 0 ] || [ "$added" -gt 0 ]; then
  echo "PASS: compatible additions only ($added functions added); refresh the baseline with abi/check_abi.sh --update"
else
  echo "PASS: ABI identical to the baseline"
fi
