"""Runs every ```python block of bindings/README.md, so the documented
snippets stay true."""
import os
import re

import pytest

README = os.environ.get("FLASHSPEC_BINDINGS_README",
                        os.path.join(os.path.dirname(__file__), "..", "..", "README.md"))


def blocks():
    with open(README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_readme_has_python_snippets():
    assert blocks(), f"no python snippet in {README}"


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_snippet_runs(index):
    exec(compile(blocks()[index], f"{README}:python[{index}]", "exec"), {"__name__": "__readme__"})
