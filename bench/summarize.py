#!/usr/bin/env python3
"""Turns a flashspec_bench JSON file into the Markdown tables of RESULTS.md:
a summary per row-count class (min / median / max of each ratio) and the
full per-shape table. Usage: summarize.py BENCH.json"""
import json
import statistics
import sys

CLASSES = [("1–16", lambda r: r <= 16, "verify ≤ 0.95, drafts ≤ 0.95"),
           ("64", lambda r: r == 64, "verify ≤ 1.00"),
           ("256–512", lambda r: r >= 256, "verify ≤ 1.00")]


def spread(values):
    return f"{min(values):.2f} · {statistics.median(values):.2f} · {max(values):.2f}"


def main(path):
    with open(path) as f:
        data = json.load(f)
    rows = data["results"]
    print(f"Card: {data['device']}, {data['date']}; measured streaming read {data['read_bandwidth_GBps']:.0f} GB/s; "
          f"median of {data['reps']} replays.\n")
    print("| rows | target | verify / GEMM (min · median · max) | greedy draft / GEMM | sampled draft / GEMM "
          "| standard / verify | GEMM / floor |")
    print("|---|---|---|---|---|---|---|")
    for name, match, target in CLASSES:
        sel = [r for r in rows if match(r["rows"])]
        if not sel:
            continue
        print(f"| {name} | {target} | {spread([r['verify_over_gemm'] for r in sel])} "
              f"| {spread([r['draft_greedy_over_gemm'] for r in sel])} "
              f"| {spread([r['draft_sampled_over_gemm'] for r in sel])} "
              f"| {spread([r['standard_over_verify'] for r in sel])} "
              f"| {spread([r['gemm_over_floor'] for r in sel])} |")
    print("\n| V | d | rows | floor ms | GEMM ms | standard ms | verify ms | greedy draft ms | sampled draft ms "
          "| verify/GEMM | greedy/GEMM | sampled/GEMM | standard/verify |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['V']} | {r['d']} | {r['rows']} | {r['floor_ms']:.4f} | {r['gemm_ms']:.4f} | {r['standard_ms']:.4f} "
              f"| {r['verify_ms']:.4f} | {r['draft_greedy_ms']:.4f} | {r['draft_sampled_ms']:.4f} "
              f"| {r['verify_over_gemm']:.2f} | {r['draft_greedy_over_gemm']:.2f} | {r['draft_sampled_over_gemm']:.2f} "
              f"| {r['standard_over_verify']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
