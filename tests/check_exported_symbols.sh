#!/bin/sh
# Compares the dynamic symbols a built libflashspec.so exports with the
# checked-in list and prints the difference. Run by `meson test`.
#   check_exported_symbols.sh NM LIBRARY EXPECTED_LIST
# After an intended API change, regenerate the list with:
#   nm -D --defined-only build/src/libflashspec.so | awk '{print $NF}' | sed 's/@.*//' | LC_ALL=C sort -u > tests/exported_symbols.txt
set -eu
nm=$1
library=$2
expected=$3
actual=$(mktemp)
trap 'rm -f "$actual"' EXIT
"$nm" -D --defined-only "$library" | awk 'NF >= 3 {print $NF}' | sed 's/@.*//' | LC_ALL=C sort -u > "$actual"
status=0
stray=$(grep -v '^flashspec_' "$actual" || true)
if [ -n "$stray" ]; then
  echo "symbols without the flashspec_ prefix are exported:"
  echo "$stray"
  status=1
fi
if ! diff -u "$expected" "$actual"; then
  echo "exported symbols of $library differ from $expected (- expected, + actual)."
  echo "If the change is intended, update $expected (see the header of this script)."
  status=1
fi
[ "$status" -eq 0 ] && echo "$(wc -l < "$actual") exported symbols match $expected"
exit "$status"
