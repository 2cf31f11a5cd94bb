#!/usr/bin/env python3
"""Tables of bench/cpu_bench.cc's JSON: ratios fused / sgemm per shape.

    bench/cpu_summarize.py AFTER.json              one run
    bench/cpu_summarize.py BEFORE.json AFTER.json  before → after

Prints Markdown: for each head dtype, one line per (V, d, rows) with the
ratios of verify (T = 1, T = 0) and draft (greedy, T = 1) to the f32 sgemm,
then the largest ratio of each column.
"""
import json
import sys

OPS = [("verify_t1", "verify T=1"), ("verify_t0", "verify T=0"), ("draft_greedy", "draft greedy"),
       ("draft_t1", "draft T=1")]


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data, {(r["head_dtype"], r["vocab"], r["hidden"], r["rows"]): r for r in data["results"]}


def ratio(r, op):
    return r[op] / r["sgemm_f32"]


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit(__doc__)
    before = load(argv[1])[1] if len(argv) == 3 else None
    after_data, after = load(argv[-1])
    print(f"threads {after_data['threads']}, median of {after_data['reps']} after {after_data['warmup']} warm-up; "
          f"{after_data['openblas']}")
    dtypes = sorted({k[0] for k in after}, key=["f32", "bf16", "f16"].index)
    for dtype in dtypes:
        keys = sorted(k for k in after if k[0] == dtype)
        print(f"\n**{dtype} head** (ratio fused / sgemm on the f32 W{'; before → after' if before else ''})\n")
        head = "| V | d | rows | sgemm ms | " + " | ".join(name for _, name in OPS) + " |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        worst = {op: (0.0, None) for op, _ in OPS}
        for k in keys:
            r = after[k]
            cells = []
            for op, _ in OPS:
                x = ratio(r, op)
                if x > worst[op][0]:
                    worst[op] = (x, k)
                old = before.get(k) if before else None
                cells.append(f"{ratio(old, op):.2f} → {x:.2f}" if old else f"{x:.2f}")
            print(f"| {k[1]} | {k[2]} | {k[3]} | {r['sgemm_f32'] * 1e3:.2f} | " + " | ".join(cells) + " |")
        print("\nlargest: " + "; ".join(f"{name} {worst[op][0]:.2f} (V {worst[op][1][1]}, d {worst[op][1][2]}, "
                                        f"rows {worst[op][1][3]})" for op, name in OPS))


if __name__ == "__main__":
    main(sys.argv)
