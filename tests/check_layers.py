#!/usr/bin/env python3
"""The layering rules of DESIGN.md §2, checked on the sources.

1. No file includes a header of a layer above its own:
   util < sampling < kernels (src/kernels and cuda/) < bandit < metrics
   < engine < capi.
2. Below src/capi no string literal spells a public argument of the C API
   ("batch->...", "params->...", "result->...", or a bare parameter name such
   as "hidden"): backends tag their errors with a Field and the C API names it.

Usage: check_layers.py SOURCE_ROOT. Prints every violation; exits 1 if any.
"""
import pathlib
import re
import sys

LAYERS = ["util", "sampling", "kernels", "bandit", "metrics", "engine", "capi"]
# Parameter names of flashspec.h functions that a message could start with.
BARE_ARGUMENTS = {"hidden", "weight", "flags", "head", "summaries", "batch", "result", "params", "out",
                  "tokens_out", "scores_out", "prompt", "prompt_len", "tokens_capacity", "target_head",
                  "max_rows", "max_requests", "ctx", "engine", "capacity", "arm"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def layer_of(root, path):
    rel = path.relative_to(root).parts
    if rel[0] == "cuda":
        return "kernels"
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    return None


def included_layer(root, including, name):
    first = name.split("/")[0]
    if first in LAYERS:
        return first
    # A bare name: a sibling in the including file's folder.
    sibling = including.parent / name
    return layer_of(root, sibling) if sibling.exists() else None


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    files = [p for d in ("src", "cuda") for p in sorted((root / d).rglob("*"))
             if p.suffix in {".h", ".cc", ".cu", ".cuh"}]
    problems = []
    for path in files:
        layer = layer_of(root, path)
        if layer is None:
            continue
        text = path.read_text()
        for name in INCLUDE.findall(text):
            target = included_layer(root, path, name)
            if target and LAYERS.index(target) > LAYERS.index(layer):
                problems.append(f"{path.relative_to(root)}: layer {layer} includes {name} of layer {target}")
        if layer == "capi":
            continue
        for literal in STRING.findall(strip_comments(text)):
            if re.match(r"(batch|params|result)->", literal) or literal in BARE_ARGUMENTS:
                problems.append(f"{path.relative_to(root)}: names the public argument \"{literal}\" below src/capi")
    for problem in problems:
        print(problem)
    print(f"checked {len(files)} files: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
