#!/usr/bin/env python3
"""Counts the test cases of the Meson test runs of .ci/test and prints the one
closing line "N passed, N failed, N skipped".

  count_tests.py [--failed N] [--skipped N] BUILD_DIR...

Each BUILD_DIR's meson-logs/testlog.json lists its test programs. A program
counts by its cases where its runner reports them in a form that does not
drift:
  GoogleTest  the XML report Meson has it write (<build>/<test>.xml, made
              during this run): each <testcase>; GTEST_SKIP and disabled
              cases are skips;
  pytest      its closing summary ("3 failed, 40 passed, 1 skipped in 0.7s");
  cargo test  its "test result: ... N passed; N failed; N ignored" lines;
  fuzz suite  the runner's "PASS|FAIL fuzz_<h> <input>" lines, one per
              regression input;
and otherwise as one case. A program Meson failed (a crash after its cases,
a sanitizer report at exit, a time-out) counts at least one failure, and a
program Meson skipped counts one skip: a runner that is absent (pytest or
numpy missing, no GPU) counts no case as passed. --failed and --skipped add
failures and skips that no log holds (a build that failed, a part that could
not run). A BUILD_DIR without a test log counts one failure.
"""
import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

PASSING = ('OK', 'EXPECTEDFAIL')

PYTEST_WORDS = r'(?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)'
PYTEST_SUMMARY = re.compile(r'^(?:=+ )?(\d+ ' + PYTEST_WORDS + r'(?:, \d+ ' + PYTEST_WORDS + r')*) in [0-9.]+s\b.*$')
CARGO_RESULT = re.compile(r'^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored;')
FUZZ_INPUT = re.compile(r'^(PASS|FAIL) fuzz_\w+ \S')


def gtest_cases(build_dir, test_name, started):
    """(passed, failed, skipped) from the test's XML report, or None."""
    path = os.path.join(build_dir, test_name + '.xml')
    try:
        if os.path.getmtime(path) < started - 2:
            return None  # left by an earlier run
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed = failed = skipped = 0
    for case in root.iter('testcase'):
        if case.find('failure') is not None or case.find('error') is not None:
            failed += 1
        elif (case.find('skipped') is not None or case.get('result') in ('skipped', 'suppressed')
              or case.get('status') == 'notrun'):
            skipped += 1
        else:
            passed += 1
    if passed + failed + skipped == 0:
        return None
    return passed, failed, skipped


def pytest_cases(stdout):
    summary = None
    for line in stdout.splitlines():
        if PYTEST_SUMMARY.match(line.strip()):
            summary = line.strip()
    if summary is None:
        return None
    counts = {}
    for number, word in re.findall(r'(\d+) (\w+)', summary):
        counts[word] = counts.get(word, 0) + int(number)
    passed = counts.get('passed', 0) + counts.get('xfailed', 0) + counts.get('xpassed', 0)
    failed = counts.get('failed', 0) + counts.get('error', 0) + counts.get('errors', 0)
    skipped = counts.get('skipped', 0)
    if passed + failed + skipped == 0:
        return None
    return passed, failed, skipped


def cargo_cases(stdout):
    found = False
    passed = failed = skipped = 0
    for line in stdout.splitlines():
        m = CARGO_RESULT.match(line.strip())
        if m:
            found = True
            passed += int(m.group(1))
            failed += int(m.group(2))
            skipped += int(m.group(3))
    if not found or passed + failed + skipped == 0:
        return None
    return passed, failed, skipped


def fuzz_inputs(stdout):
    passed = failed = 0
    for line in stdout.splitlines():
        m = FUZZ_INPUT.match(line)
        if m:
            if m.group(1) == 'PASS':
                passed += 1
            else:
                failed += 1
    if passed + failed == 0:
        return None
    return passed, failed, 0


def count_program(build_dir, entry):
    result = entry.get('result', '')
    if result == 'SKIP':
        return 0, 0, 1
    name = entry.get('name', '').split(' / ', 1)[-1]
    stdout = entry.get('stdout') or ''
    cases = (gtest_cases(build_dir, name, entry.get('starttime', 0)) or pytest_cases(stdout)
             or cargo_cases(stdout) or fuzz_inputs(stdout))
    if cases is None:
        return (1, 0, 0) if result in PASSING else (0, 1, 0)
    passed, failed, skipped = cases
    if result not in PASSING and failed == 0:
        failed = 1
    return passed, failed, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--failed', type=int, default=0)
    parser.add_argument('--skipped', type=int, default=0)
    parser.add_argument('build_dirs', nargs='*')
    args = parser.parse_args()
    passed, failed, skipped = 0, args.failed, args.skipped
    for build_dir in args.build_dirs:
        log = os.path.join(build_dir, 'meson-logs', 'testlog.json')
        try:
            with open(log) as f:
                entries = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            print(f'{build_dir}: no test log ({e})')
            failed += 1
            continue
        counts = [0, 0, 0]
        for entry in entries:
            for i, n in enumerate(count_program(build_dir, entry)):
                counts[i] += n
        print(f'{build_dir}: {len(entries)} test programs; cases {counts[0]} ok, {counts[1]} not ok, '
              f'{counts[2]} skip')
        passed += counts[0]
        failed += counts[1]
        skipped += counts[2]
    print(f'{passed} passed, {failed} failed, {skipped} skipped')
    return 0


if __name__ == '__main__':
    sys.exit(main())
