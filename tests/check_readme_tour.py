#!/usr/bin/env python3
"""The README's API tour is examples/api_tour.c: every line of its C block
stands in that file, in order, and its build command builds a program that
runs. Usage: check_readme_tour.py SOURCE_ROOT BUILD_ROOT"""
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile


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
    # The command as written runs from the repository root with the build in
    # build/: run it so, with this build's directory in its place.
    command = command.replace('"$PWD/build/src"', shlex.quote(str(build / "src"))).replace("build/src", str(build / "src"))
    with tempfile.TemporaryDirectory() as scratch:
        os.symlink(source / "examples", pathlib.Path(scratch) / "examples")
        os.symlink(source / "include", pathlib.Path(scratch) / "include")
        run = subprocess.run(command, shell=True, cwd=scratch, capture_output=True, text=True)
    print(run.stdout, run.stderr, sep="")
    if run.returncode != 0:
        print(f"the README's build command failed ({run.returncode}): {command}")
        return 1
    print("README API tour: code matches examples/api_tour.c; build command builds and runs it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
