#!/usr/bin/env python3
"""The README's API tour is examples/api_tour.c: every line of its C block
stands in that file, in order, and its build command builds a program that
runs. Usage: check_readme_tour.py SOURCE_ROOT BUILD_ROOT"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_readme_commands  # noqa: E402


def section(readme, title):
    start = readme.index(f"## {title}\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else len(readme)]


def main(source, build):
    source, build = pathlib.Path(source).resolve(), pathlib.Path(build).resolve()
    tour = section((source / "README.md").read_text(), "API tour")
    code = re.search(r"```c\n(.*?)```", tour, re.S).group(1)
    program = [line.strip() for line in (source / "examples" / "api_tour.c").read_text().splitlines()]
    position = 0
    for line in (l.strip() for l in code.splitlines()):
        if not line:
            continue
        try:
            position = program.index(line, position) + 1
        except ValueError:
            print(f"README's API tour line not in examples/api_tour.c (in order): {line}")
            return 1
    command = re.search(r"```sh\n(.*?)\n```", tour, re.S).group(1)
    # The command runs as written, from a repository root "after ./.ci/test"
    # (which builds into build/): a scratch root whose examples/ and
    # include/ are the sources' and whose build/ is this build.
    with tempfile.TemporaryDirectory() as scratch:
        for name, target in (("examples", source / "examples"), ("include", source / "include"), ("build", build)):
            os.symlink(target, pathlib.Path(scratch) / name)
        # Without the variables Meson sets for a test (LD_LIBRARY_PATH): the
        # command's rpath alone must find the library.
        run = subprocess.run(["bash", "-c", command], cwd=scratch, capture_output=True, text=True,
                             env=check_readme_commands.fresh_environment())
    print(run.stdout, run.stderr, sep="")
    if run.returncode != 0:
        print(f"the README's build command failed ({run.returncode}): {command}")
        return 1
    if "request 0: accepted" not in run.stdout:
        print("the program the README's command builds did not print its results")
        return 1
    print(f"README API tour: code matches examples/api_tour.c; `{command}` ran as written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
