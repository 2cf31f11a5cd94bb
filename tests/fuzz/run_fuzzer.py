#!/usr/bin/env python3
"""Runs one libFuzzer harness for the fuzz test suite (tests/fuzz/README.md).

  run_fuzzer.py regress HARNESS --regressions DIR --work DIR
      Replays every input in DIR (the reproducers of defects found before),
      each in its own process; fails if any of them fails.

  run_fuzzer.py fuzz HARNESS --corpus DIR --regressions DIR --work DIR --runs N
      Fuzzes for N executions. The seeds are the committed corpus and the
      regression inputs that pass; new inputs go to WORK/corpus (never into
      the source tree); a failing input is saved as WORK/crash-* and the
      message says how to keep it as a regression input.

The environment variables FLASHSPEC_FUZZ_RUNS (executions), FLASHSPEC_FUZZ_SEED
(libFuzzer -seed) and FLASHSPEC_FUZZ_ARGS (extra libFuzzer flags) override the
defaults. Prints one line 'fuzz NAME: N executions in S s' per run.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

# Per-input limits: a hang longer than TIMEOUT seconds is a failure.
TIMEOUT_S = 25
MAX_LEN = 4096
RSS_LIMIT_MB = 2560


def inputs_in(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, f)
        for f in os.listdir(directory)
        if not f.startswith('.') and not f.endswith('.md') and os.path.isfile(os.path.join(directory, f)))


def harness_name(harness):
    return os.path.basename(harness)


def env_with_defaults():
    env = dict(os.environ)
    env.setdefault('ASAN_OPTIONS', 'detect_leaks=1')
    env.setdefault('UBSAN_OPTIONS', 'halt_on_error=1:print_stacktrace=1')
    return env


def first_lines(text, marker_re, limit=12):
    """The violation / sanitizer report lines of a failed run."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.search(marker_re, line):
            return '\n'.join(lines[i:i + limit])
    return '\n'.join(lines[-limit:])


FAILURE_MARKERS = r'FLASHSPEC INVARIANT VIOLATED|ERROR: AddressSanitizer|runtime error:|ERROR: libFuzzer|' \
                  r'ERROR: LeakSanitizer|deadly signal|==ERROR'


def replay(harness, path, work):
    """Runs one input; returns (ok, report)."""
    cmd = [harness, f'-timeout={TIMEOUT_S}', f'-rss_limit_mb={RSS_LIMIT_MB}',
           f'-artifact_prefix={work}/', path]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env_with_defaults(),
                              timeout=TIMEOUT_S * 4)
    except subprocess.TimeoutExpired:
        return False, f'no result after {TIMEOUT_S * 4} s (hang)'
    text = proc.stdout.decode(errors='replace')
    if proc.returncode == 0:
        return True, ''
    return False, first_lines(text, FAILURE_MARKERS)


def regress(args):
    name = harness_name(args.harness)
    os.makedirs(args.work, exist_ok=True)
    files = inputs_in(args.regressions)
    if not files:
        print(f'{name}: no regression inputs in {args.regressions}')
        return 0
    failed = []
    for path in files:
        ok, report = replay(args.harness, path, args.work)
        print(f'{"PASS" if ok else "FAIL"} {name} {os.path.relpath(path)}')
        if not ok:
            print('    ' + report.replace('\n', '\n    '))
            failed.append(path)
    print(f'{name}: {len(files) - len(failed)} of {len(files)} regression inputs pass')
    return 1 if failed else 0


def fuzz(args):
    name = harness_name(args.harness)
    runs = int(os.environ.get('FLASHSPEC_FUZZ_RUNS', args.runs))
    if os.path.isdir(args.work):
        shutil.rmtree(args.work)
    corpus = os.path.join(args.work, 'corpus')
    os.makedirs(corpus)
    # Passing regression inputs are seeds too; failing ones are the regress
    # test's to report, so they do not stop the fuzzing at its first input.
    skipped = []
    for path in inputs_in(args.regressions):
        ok, _ = replay(args.harness, path, args.work)
        if ok:
            shutil.copy(path, os.path.join(corpus, 'regression-' + os.path.basename(path)))
        else:
            skipped.append(os.path.basename(path))
    if skipped:
        print(f'{name}: not seeding with failing regression inputs {", ".join(skipped)} '
              f'(the fuzz_{name[5:]}_regressions test reports them)')
    seed = os.environ.get('FLASHSPEC_FUZZ_SEED', str(int.from_bytes(os.urandom(4), 'little') or 1))
    cmd = [args.harness, f'-runs={runs}', f'-seed={seed}', f'-max_len={MAX_LEN}', f'-timeout={TIMEOUT_S}',
           f'-rss_limit_mb={RSS_LIMIT_MB}', f'-artifact_prefix={args.work}/', '-print_final_stats=1',
           '-reduce_inputs=1', corpus, args.corpus]
    cmd += shlex.split(os.environ.get('FLASHSPEC_FUZZ_ARGS', ''))
    print(' '.join(shlex.quote(c) for c in cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env_with_defaults())
    elapsed = time.monotonic() - start
    text = proc.stdout.decode(errors='replace')
    done = re.search(r'Done (\d+) runs in (\d+) second', text)
    executed = re.search(r'stat::number_of_executed_units:\s*(\d+)', text)
    count = int(executed.group(1)) if executed else (int(done.group(1)) if done else 0)
    print(f'fuzz {name}: {count} executions in {elapsed:.1f} s (seed {seed})')
    if proc.returncode == 0:
        tail = [l for l in text.splitlines() if l.startswith(('#', 'stat::', 'Done'))][-6:]
        print('\n'.join(tail))
        return 0
    print(text[-12000:])
    crashes = [f for f in os.listdir(args.work) if re.match(r'(crash|timeout|oom|leak)-', f)]
    for c in crashes:
        src = os.path.join(args.work, c)
        dest = os.path.join(args.regressions, f'<defect>-{c}')
        print(f'FAILING INPUT: {src}\n  replay:  {args.harness} {src}\n'
              f'  keep as a regression input:  cp {src} {dest}')
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('mode', choices=['regress', 'fuzz'])
    parser.add_argument('harness')
    parser.add_argument('--corpus', default='')
    parser.add_argument('--regressions', required=True)
    parser.add_argument('--work', required=True)
    parser.add_argument('--runs', type=int, default=20000)
    args = parser.parse_args()
    args.harness = os.path.abspath(args.harness)
    args.work = os.path.abspath(args.work)
    return regress(args) if args.mode == 'regress' else fuzz(args)


if __name__ == '__main__':
    sys.exit(main())
