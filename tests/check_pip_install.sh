#!/bin/sh
# `pip install .` from a clean virtual environment builds the library and
# the Python binding (pyproject.toml, meson-python) and the package imports
# and runs, with its type stubs and py.typed installed beside it. The
# sources are copied first, so the check leaves the tree as it was. Needs python3 with venv and access to PyPI (for meson-python, meson,
# ninja and numpy), as CI has.
#   check_pip_install.sh SOURCE_ROOT [PYTHON]   (default: python3 on PATH)
set -eu
source=$1
python=${2:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "SKIP: no $python"; exit 77; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$python" - "$source" "$scratch/src" <<'PY'
import shutil, sys
skip = shutil.ignore_patterns(".git", "build*", ".mesonpy-*", "target", ".ab", ".gpu", "__pycache__")
shutil.copytree(sys.argv[1], sys.argv[2], ignore=skip, symlinks=True)
PY
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet "$scratch/src" --config-settings=setup-args=-Dcuda=disabled > "$scratch/pip.log" 2>&1 || {
  tail -40 "$scratch/pip.log"
  echo "FAIL: pip install . did not succeed"
  exit 1
}
cd "$scratch"
"$scratch/venv/bin/python" - <<'PY'
import numpy as np
import flashspec
with flashspec.Context("cpu", seed=1) as ctx:
    w = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    head = ctx.lm_head(w)
    tokens, _ = ctx.draft(head, w[:3])
    assert list(tokens) == [int(np.argmax(w @ w[r])) for r in range(3)], tokens
# The type information (PEP 561) comes with the package.
import pathlib
package = pathlib.Path(flashspec.__file__).parent
stubs = ("__init__.pyi", "_controls.pyi", "_core.pyi", "_engine.pyi", "errors.pyi", "capi.pyi")
missing = [n for n in ("py.typed",) + stubs if not (package / n).is_file()]
assert not missing, f"not installed in {package}: {missing}"
print(f"pip install .: flashspec {flashspec.version()} imported from {flashspec.__file__}")
PY
