"""Runs one pytest file for `meson test`. Exit 77 (meson's SKIP) when pytest
or numpy is missing, or when every test of the file skipped (for example the
GPU tests on a machine without a GPU); the reasons are printed."""
import sys

try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print(f"SKIP: {e.name} is not installed for {sys.executable} (pip install numpy pytest)")
    sys.exit(77)


class _Outcomes:
    def __init__(self):
        self.ran = 0
        self.skipped = 0

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped += 1

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and not report.skipped:
            self.ran += 1
        elif report.skipped:
            self.skipped += 1


outcomes = _Outcomes()
code = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", sys.argv[1]], plugins=[outcomes])
if code in (0, 5) and outcomes.ran == 0 and outcomes.skipped > 0:
    sys.exit(77)
sys.exit(int(code))
