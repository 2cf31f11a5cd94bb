#!/usr/bin/env python3
"""Summarises an A/B log of builds measured in one run: the lines that
flashspec_bench and flashspec_quantized_bench print for `--only V d rows`,
each prefixed with its build's name and, where the run had several rounds,
a round token (r1, r2, ...), in either order (a `q` token, which some logs
put before 8-bit lines, is ignored), as in the bench/results-*-ab-*.txt
files:

    r1 base V=128256 d= 4096 rows= 16 | floor 0.2254 gemm 0.2476 ... ms | ...
    old r2 V=128256 d= 4096 rows= 16 | gemm 0.2473 verify 0.2851 ... ms | ...

Prints, for every shape, each op's median time over the rounds per build
(µs) and its change against the base build, then per row count the ratio to
the base (min · median · max over the shapes). Lines of the 8-bit-head bench
(they carry e4m3 times) are kept apart from the 16-bit bench's.

Usage: ab.py LOG [--base NAME] [--ops verify,draft_g,...]"""
import argparse
import collections
import re
import signal
import statistics
import sys

LINE = re.compile(r"^(?P<labels>.*?)\s*V=\s*(?P<V>\d+) d=\s*(?P<d>\d+) rows=\s*(?P<rows>\d+) \| (?P<times>.*?) ms")
ROUND = re.compile(r"^r\d+[a-z]?$")  # r1, r2, ... (r3b: a round repeated)
DEFAULT_OPS = {"bf16": ["verify", "draft_g", "draft_s"], "8-bit": ["verify", "e4m3", "int8", "e4m3_g", "int8_g"]}


def parse(path):
    """{(bench, V, d, rows): {build: {op: [ms, ...]}}}, the builds in order of
    appearance, and how many bench lines named no build (skipped)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    builds = []
    unnamed = 0
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            names = [t for t in m["labels"].split() if not ROUND.match(t) and t != "q"]
            if not names:
                unnamed += 1
                continue
            if len(names) > 1:
                sys.exit(f"{path}: a line names more than one build: {line.strip()}")
            build = names[0]
            if build not in builds:
                builds.append(build)
            fields = m["times"].split()
            times = {fields[i]: float(fields[i + 1]) for i in range(0, len(fields) - 1, 2)}
            bench = "8-bit" if "e4m3" in times else "bf16"
            shape = (bench, int(m["V"]), int(m["d"]), int(m["rows"]))
            for op, ms in times.items():
                runs[shape][build][op].append(ms)
    return runs, builds, unnamed


def spread(values):
    return f"{min(values):.3f} · {statistics.median(values):.3f} · {max(values):.3f}"


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a pipe to head ends the output quietly
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--base", help="the build the others are compared with (default: the first in the log)")
    parser.add_argument("--ops", help="comma-separated op names (default: the bench's verify and drafts)")
    args = parser.parse_args()
    runs, builds, unnamed = parse(args.log)
    if not runs:
        sys.exit(f"{args.log}: no bench lines")
    base = args.base or builds[0]
    if base not in builds:
        sys.exit(f"no build named {base}; the log has {', '.join(builds)}")
    others = [b for b in builds if b != base]
    ratios = collections.defaultdict(list)  # (bench, rows, build, op) -> [ratio]
    for shape in sorted(runs):
        bench, V, d, rows = shape
        ops = args.ops.split(",") if args.ops else DEFAULT_OPS[bench]
        cells = []
        for op in ops:
            if op not in runs[shape].get(base, {}):
                continue
            old = statistics.median(runs[shape][base][op]) * 1e3
            if old == 0.0:  # an op the bench did not run at this shape (a tree at one row)
                continue
            parts = [f"{base} {old:.1f}"]
            for b in others:
                if op not in runs[shape].get(b, {}):
                    continue
                new = statistics.median(runs[shape][b][op]) * 1e3
                parts.append(f"{b} {new:.1f} ({new - old:+.1f})")
                ratios[(bench, rows, b, op)].append(new / old)
            cells.append(f"{op}: {', '.join(parts)}")
        label = f"{'8-bit ' if bench == '8-bit' else ''}{V} × {d} × {rows}"
        print(f"{label}: " + " | ".join(cells))
    if unnamed:
        print(f"\n({unnamed} bench lines without a build name skipped)")
    print(f"\ntime ÷ {base}'s, min · median · max over the shapes")
    for key in sorted(ratios):
        bench, rows, b, op = key
        print(f"{bench} {rows} rows, {b} {op}: {spread(ratios[key])} ({len(ratios[key])} shapes)")


if __name__ == "__main__":
    main()
