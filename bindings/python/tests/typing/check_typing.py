#!/usr/bin/env python3
"""The type information of the flashspec package (PEP 561) against the
module, for `meson test`:

1. the stubs' __all__ (package and flashspec.errors) name for name equals
   the module's, and every name in it is bound in the stub;
2. py.typed and every stub sit beside the package Python imports, and the
   Meson install plan installs each of them into the package;
3. stubtest finds no difference between stubs and module (signatures,
   defaults, classes, enum members), beyond stubtest_allowlist.txt;
4. mypy --strict accepts the stubs themselves and typed_example.py, which
   is then run; it rejects every line of typed_misuse.py marked
   "expect-error", and no other line.

Exit 77 (meson's skip) when mypy is not installed for this Python.
Usage: check_typing.py BUILD_ROOT (with the built package on PYTHONPATH)."""
import ast
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
STUBS = ["__init__.pyi", "_controls.pyi", "_core.pyi", "_engine.pyi", "_batch_engine.pyi", "errors.pyi", "capi.pyi"]


def stub_all_and_bound(path):
    """The stub's __all__ list and the names it binds at module level."""
    tree = ast.parse(path.read_text(), str(path))
    exported, bound = None, set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                    if target.id == "__all__":
                        exported = ast.literal_eval(node.value)
        elif isinstance(node, ast.ImportFrom):
            # In a stub only "import X as X" re-exports.
            bound.update(a.asname for a in node.names if a.asname == a.name)
    return exported, bound


def compare_all(label, runtime_all, stub_path):
    failures = []
    stub_all, bound = stub_all_and_bound(stub_path)
    if stub_all is None:
        return [f"{stub_path.name} has no __all__"]
    for names, where in ((runtime_all, label), (stub_all, stub_path.name)):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            failures.append(f"{where}: __all__ lists {duplicates} twice")
    missing = sorted(set(runtime_all) - set(stub_all))
    extra = sorted(set(stub_all) - set(runtime_all))
    if missing:
        failures.append(f"in {label}.__all__ but not in {stub_path.name}'s: {missing}")
    if extra:
        failures.append(f"in {stub_path.name}'s __all__ but not in {label}.__all__: {extra}")
    unbound = sorted(set(stub_all) - bound)
    if unbound:
        failures.append(f"{stub_path.name} lists {unbound} in __all__ without defining or re-exporting them")
    return failures


def run_mypy(*args, cwd):
    run = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def main(build_root):
    if importlib.util.find_spec("mypy") is None:
        print(f"SKIP: mypy is not installed for {sys.executable} (.ci/install-deps installs it)")
        return 77
    import flashspec
    import flashspec.errors

    failures = []
    package = pathlib.Path(flashspec.__file__).parent
    print(f"flashspec from {package}")

    # 1. __all__, name for name.
    failures += compare_all("flashspec", list(flashspec.__all__), package / "__init__.pyi")
    failures += compare_all("flashspec.errors", list(flashspec.errors.__all__), package / "errors.pyi")
    for name in flashspec.__all__:
        if not hasattr(flashspec, name):
            failures.append(f"flashspec.__all__ names {name}, which the module lacks")

    # 2. The files, beside the package and in the install plan.
    for name in STUBS + ["py.typed"]:
        if not (package / name).is_file():
            failures.append(f"{name} is not beside the package ({package})")
    installed = json.loads((pathlib.Path(build_root) / "meson-info" / "intro-installed.json").read_text())
    destinations = {pathlib.PurePosixPath(d) for d in installed.values()}
    for name in STUBS + ["py.typed"]:
        if not any(d.name == name and d.parent.name == "flashspec" for d in destinations):
            failures.append(f"meson install does not install flashspec/{name}")

    cache = pathlib.Path(build_root).resolve() / "bindings" / "python" / "mypy-cache"
    # The checks run in a scratch directory: the package by absolute path.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(package.parent)] + [
        str(pathlib.Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    with tempfile.TemporaryDirectory() as scratch:
        common = ["--strict", "--cache-dir", str(cache), "--config-file", str(HERE / "mypy.ini")]
        # 3. stubtest: the stubs against the imported module.
        run = subprocess.run([sys.executable, "-m", "mypy.stubtest", "flashspec", "--mypy-config-file",
                              str(HERE / "mypy.ini"), "--allowlist", str(HERE / "stubtest_allowlist.txt")],
                             cwd=scratch, capture_output=True, text=True)
        if run.returncode != 0:
            failures.append("stubtest: the stubs differ from the module:\n" + run.stdout + run.stderr)
        else:
            print("stubtest: the stubs match the module")

        # 4. mypy --strict: the stubs, the example, the misuses.
        code, out = run_mypy(*common, *[str(package / s) for s in STUBS], cwd=scratch)
        if code != 0:
            failures.append("mypy --strict rejects the stubs:\n" + out)
        code, out = run_mypy(*common, str(HERE / "typed_example.py"), cwd=scratch)
        if code != 0:
            failures.append("mypy --strict rejects typed_example.py:\n" + out)
        else:
            print("mypy --strict: typed_example.py passes")
        run = subprocess.run([sys.executable, str(HERE / "typed_example.py")], cwd=scratch,
                             capture_output=True, text=True)
        if run.returncode != 0 or "typed example: ok" not in run.stdout:
            failures.append("typed_example.py failed when run:\n" + run.stdout + run.stderr)

        misuse = HERE / "typed_misuse.py"
        expected = {i for i, line in enumerate(misuse.read_text().splitlines(), 1) if "# expect-error" in line}
        code, out = run_mypy(*common, str(misuse), cwd=scratch)
        reported = {int(m.group(1)) for m in re.finditer(r"typed_misuse\.py:(\d+): error:", out)}
        if not expected:
            failures.append("typed_misuse.py marks no line")
        if reported != expected:
            failures.append(f"typed_misuse.py: mypy missed lines {sorted(expected - reported)} and flagged "
                            f"unmarked lines {sorted(reported - expected)}:\n{out}")
        else:
            print(f"mypy --strict: all {len(expected)} misuses of typed_misuse.py rejected")

    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("typing: stubs, py.typed and __all__ agree with the module")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
