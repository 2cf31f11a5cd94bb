#!/usr/bin/env python3
"""The shell commands of README.md and the bindings' READMEs, run as written.

Every line of a fenced block marked sh/bash/shell/console in README.md or a
README.md under bindings/
must have an entry in PLAN below, and every entry must still be a line of
its README: a command added to or changed in a README fails the `plan`
check until this file says how it is covered. Each block must be preceded
by prose naming the directory it runs from ("from the repository root"),
and a command run "after ./.ci/test" must say so.

How the commands run (one Meson test per group, suite 'docs'):

- In a copy of the repository (the files git tracks plus untracked ones it
  does not ignore, as a clone with the working tree's changes would have),
  from its root, each line as one `bash -c` with the line unchanged.
- With the environment of a fresh Debian 12 machine after .ci/install-deps:
  no CUDA toolkit on PATH (install-deps installs none; otherwise
  `meson setup build` and `pip install .` would compile the CUDA backend,
  ~10 minutes on 2 cores), and none of the variables Meson sets for tests
  (LD_LIBRARY_PATH, PYTHONPATH, ...), so nothing the command does not set
  itself helps it.
- Commands documented as run "after ./.ci/test (which builds into build/)"
  find build/ in the copy as a link to the build directory of this test
  run: the build ./.ci/test makes, in CI exactly that directory. They only
  read it (the Go and Rust builds write into the copy or their own caches).
- Commands that need a build of their own (`meson setup build`) get a fresh
  one in the copy; `./.ci/quickstart` makes build-quickstart/ itself.

Usage: check_readme_commands.py GROUP SOURCE_ROOT BUILD_ROOT
  GROUP: plan, quickstart, bindings_meson, python_pip, go, rust
  (the API tour's command is run by tests/check_readme_tour.py)
Exit 77 (meson's skip) when a group's tool is missing (go, cargo >= 1.77);
then that group's commands have not run and do not count as passed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}


@dataclasses.dataclass
class Command:
    readme: str                # the README, relative to the repository root
    line: str                  # the line exactly as the README shows it
    group: str                 # the Meson test that runs it (readme_<group>), or "excluded"
    why: str                   # why it runs as it does, or why it is excluded
    run: str | None = None     # the part that runs, when not the whole line
    after_ci_test: bool = False  # documented as run after ./.ci/test (build/ exists)


PLAN = [
    Command("README.md", "./.ci/quickstart   # installs what is missing, builds, generates text with the "
            "trained Llama pair in C, plain and speculative (and runs the GPU benchmark when a GPU is present)",
            "quickstart",
            "run in a fresh copy: installs nothing where .ci/install-deps has run, configures and builds "
            "build-quickstart/, runs the C quick start, then flashspec-llama in every mode on the shipped "
            "models (with a GPU it also builds the CUDA backend and runs the benchmark, as it says)"),
    Command("README.md", "./.ci/test         # builds and runs the whole test suite; ends with "
            "\"N passed, N failed, N skipped\"", "excluded",
            "it runs the whole suite, this test included, so running it here would recurse; it is the "
            "command CI runs (.ci/run calls it as written) and the one that runs this test"),
    Command("README.md", "cc examples/api_tour.c -Iinclude -Lbuild/src -Wl,-rpath,\"$PWD/build/src\" -lflashspec "
            "-lm -o api_tour && ./api_tour", "api_tour",
            "run by readme_api_tour (tests/check_readme_tour.py, suites examples and docs), from a root "
            "whose build/ is this build, which also checks the README's lines against examples/api_tour.c",
            after_ci_test=True),
    Command("bindings/README.md", "meson setup build && meson test -C build                 # everything",
            "bindings_meson",
            "`meson setup build` runs in a fresh copy; `meson test -C build` (every suite) is excluded: it "
            "includes this suite, so it would recurse, and it is what ./.ci/test runs on build/ in CI",
            run="meson setup build"),
    Command("bindings/README.md", "meson test -C build --suite python --suite go --suite rust --suite abi",
            "bindings_meson",
            "run on the build/ the previous line configured (Meson builds what those suites need); its "
            "test log must show tests that ran and none that failed"),
    Command("bindings/README.md", "python3 -m venv venv && venv/bin/pip install .   # add "
            "--config-settings=setup-args=-Dcuda=disabled to leave CUDA out", "python_pip",
            "run in a fresh copy: builds the library and the binding with meson-python from PyPI's "
            "meson-python, meson and ninja"),
    Command("bindings/README.md", "venv/bin/python -c \"import flashspec; print(flashspec.version())\"",
            "python_pip", "run after the previous line; it must print the project's version"),
    Command("bindings/README.md", "cd bindings/go && PKG_CONFIG_PATH=\"$PWD/../../build/meson-uninstalled\" "
            "LD_LIBRARY_PATH=\"$PWD/../../build/src\" go test ./...", "go",
            "run from a copy whose build/ is this build; skipped without go or swig",
            after_ci_test=True),
    Command("bindings/README.md", "PKG_CONFIG_PATH=\"$PWD/build/meson-uninstalled\" "
            "LD_LIBRARY_PATH=\"$PWD/build/src\" cargo test --offline --manifest-path bindings/rust/Cargo.toml",
            "rust", "run from a copy whose build/ is this build; skipped without cargo >= 1.77 (the "
            "crates' rust-version; Debian 12's is 1.65, as the README says)", after_ci_test=True),
]


def shell_blocks(text):
    """(language, body, prose before it) of each shell block of a Markdown text."""
    blocks = []
    for m in re.finditer(r"^```([\w.+-]*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) not in SHELL_LANGUAGES:
            continue
        before = text[:m.start()].rstrip()
        # The paragraph before the block: back to a blank line or a fence.
        start = max(before.rfind("\n\n"), before.rfind("```"))
        blocks.append((m.group(1), m.group(2), before[start + 1:]))
    return blocks


def readme_lines(source):
    """{(readme, line): prose before its block} for every shell line."""
    lines = {}
    readmes = ["README.md"] + sorted(str(p.relative_to(source)) for p in (source / "bindings").rglob("README.md")
                                     if "target" not in p.relative_to(source).parts)
    for readme in readmes:
        for _, body, prose in shell_blocks((source / readme).read_text(encoding="utf-8")):
            for line in body.splitlines():
                if line.strip():
                    lines[(readme, line.strip())] = " ".join(prose.split())
    return lines


def check_plan(source):
    failures = []
    lines = readme_lines(source)
    planned = {(c.readme, c.line): c for c in PLAN}
    for key, prose in lines.items():
        command = planned.get(key)
        if command is None:
            failures.append(f"{key[0]}: a shell command the plan does not cover (add it to PLAN in "
                            f"{pathlib.Path(__file__).name}): {key[1]}")
            continue
        if "from the repository root" not in prose.lower():
            failures.append(f"{key[0]}: the prose before `{key[1]}` does not say where it runs "
                            f"(\"from the repository root\"): {prose!r}")
        if command.after_ci_test and "./.ci/test" not in prose:
            failures.append(f"{key[0]}: `{key[1]}` needs build/, but the prose before it does not say "
                            f"\"after ./.ci/test\": {prose!r}")
    for key in planned:
        if key not in lines:
            failures.append(f"{key[0]}: the plan names a command the README no longer shows: {key[1]}")
    print("README shell commands and how they are covered:")
    for c in PLAN:
        state = "EXCLUDED" if c.group == "excluded" else f"readme_{c.group}"
        print(f"  [{state}] {c.readme}: {c.line}\n      {c.why}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


# ---- running commands --------------------------------------------------------
def copy_repository(source, dest):
    """The files a clone would have, with the working tree's changes: what git
    tracks plus untracked files it does not ignore (build trees, venv/ and
    such stay behind). Without git, everything but build outputs."""
    try:
        listed = subprocess.run(["git", "-C", str(source), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
        files = [f for f in listed.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = None
    if files is None:
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", "build*", ".mesonpy-*", "target", "venv", "__pycache__"))
        return
    for name in files:
        src, dst = source / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def fresh_environment():
    """This environment as a fresh Debian 12 machine after install-deps has
    it: no CUDA toolkit on PATH, nothing Meson sets for a test."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MESON", "CGO_"))
           and k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "PKG_CONFIG_PATH", "MALLOC_PERTURB_", "BUILD_DIR",
                         "VIRTUAL_ENV", "CARGO_TARGET_DIR", "GOFLAGS", "GOCACHE", "CUDA_PATH", "CUDACXX")}
    keep = []
    for entry in env.get("PATH", "").split(os.pathsep):
        if entry and "cuda" not in entry.lower() and not os.path.exists(os.path.join(entry, "nvcc")):
            keep.append(entry)
    env["PATH"] = os.pathsep.join(keep)
    return env


def run_line(command, root, env, log):
    """One README line (or its part that runs), as bash runs it from root."""
    text = command.run or command.line
    print(f"$ {text}    (from the repository root)", flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        status = subprocess.run(["bash", "-c", text], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
    seconds = time.monotonic() - start
    output = pathlib.Path(log).read_text(errors="replace")
    tail = "\n".join(output.splitlines()[-40 if status else -6:])
    print(tail)
    print(f"  -> exit {status} after {seconds:.0f} s", flush=True)
    return status, output


def commands_of(group):
    return [c for c in PLAN if c.group == group]


def cargo_ok(env):
    cargo = shutil.which("cargo", path=env["PATH"])
    if cargo is None:
        return "cargo is not installed"
    version = subprocess.run([cargo, "--version"], capture_output=True, text=True, env=env).stdout
    m = re.search(r"(\d+)\.(\d+)", version)
    if not m or (int(m.group(1)), int(m.group(2))) < (1, 77):
        return f"{version.strip()} is older than the crates' rust-version 1.77"
    return None


def run_group(group, source, build):
    env = fresh_environment()
    if group == "go":
        missing = [tool for tool in ("go", "swig") if shutil.which(tool, path=env["PATH"]) is None]
        if missing:
            print(f"SKIP: {' and '.join(missing)} not installed: the Go command has not run")
            return 77
    if group == "rust":
        reason = cargo_ok(env)
        if reason:
            print(f"SKIP: {reason}: the Rust command has not run")
            return 77
    commands = commands_of(group)
    with tempfile.TemporaryDirectory(prefix=f"readme-{group}-") as scratch:
        root = pathlib.Path(scratch) / "flashspec"
        copy_repository(source, root)
        if any(c.after_ci_test for c in commands):
            os.symlink(build, root / "build")
        for i, command in enumerate(commands):
            status, output = run_line(command, root, env, pathlib.Path(scratch) / f"command{i}.log")
            if status != 0:
                print(f"FAIL: {command.readme}: `{command.line}` exited {status}")
                return 1
            problem = check_result(group, i, root, output, source)
            if problem:
                print(f"FAIL: {command.readme}: `{command.line}`: {problem}")
                return 1
    print(f"readme_{group}: {len(commands)} README command(s) ran as written and did what they say")
    return 0


def check_result(group, index, root, output, source):
    """What each command must have done beyond exiting 0 (None: it did)."""
    if group == "quickstart":
        if "6 tokens emitted in one verify pass" not in output:
            return "the C quick start's summary line is missing from its output"
        # The main job: every mode generated, and each speculative mode
        # reports its speedup and per-position acceptance.
        for mode in ("plain", "ngram", "draft", "bandit", "suffix"):
            if f"=== mode {mode} ===" not in output:
                return f"flashspec-llama's {mode} mode is missing from its output"
        # As the quick start tells: nvidia-smi lists a GPU; with one (and the
        # CUDA build) flashspec-llama runs a second time, with --device cuda.
        gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
        cuda_module = list((root / "build-quickstart" / "src").glob("libflashspec-cuda.so*"))
        runs = 2 if gpu and cuda_module else 1
        if output.count("speedup vs plain") != 4 * runs or output.count("per position:") != 4 * runs:
            return (f"flashspec-llama did not report speedup and acceptance per position for its four drafters "
                    f"in each of its {runs} run(s)")
        if runs == 2 and "device cuda" not in output:
            return "flashspec-llama --device cuda did not run on the GPU"
        if not gpu and cuda_module:
            return f"it built the CUDA backend on a machine without a GPU: {cuda_module[0].name}"
    if group == "bindings_meson" and index == 1:
        results = [json.loads(line) for line in (root / "build" / "meson-logs" / "testlog.json").open()]
        name = lambda r: r["name"].split(" / ")[-1]  # noqa: E731 ("flashspec:suite / name")
        ran = [name(r) for r in results if r["result"] == "OK"]
        bad = [name(r) for r in results if r["result"] not in ("OK", "SKIP", "EXPECTEDFAIL")]
        if bad or not any(name.startswith("python") for name in ran):
            return f"its tests: passed {ran}, failed {bad}"
        print(f"  tests that ran: {', '.join(sorted(ran))}")
    if group == "go" and not re.search(r"^ok\s+github\.com/flashspec/flashspec/bindings/go\s", output, re.M):
        return "go test did not report the package's tests as passed"
    if group == "rust":
        passed = sum(int(n) for n in re.findall(r"^test result: ok\. (\d+) passed", output, re.M))
        if passed == 0 or "Doc-tests flashspec\n" not in output:
            return f"cargo test passed {passed} tests; the flashspec crate's doctests (the README's blocks) must run"
        print(f"  cargo test: {passed} tests passed, doctests included")
    if group == "python_pip" and index == 1:
        version = re.search(r"^\s*version: '([^']+)'", (source / "meson.build").read_text(), re.M).group(1)
        if output.strip() != version:
            return f"printed {output.strip()!r}, not the version {version}"
    return None


def main(group, source, build):
    source, build = pathlib.Path(source).resolve(), pathlib.Path(build).resolve()
    if group == "plan":
        return check_plan(source)
    if group not in {c.group for c in PLAN} - {"excluded", "api_tour"}:
        print(f"unknown group {group}")
        return 2
    return run_group(group, source, build)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
