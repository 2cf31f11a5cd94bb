#!/usr/bin/env python3
"""Compares two flashspec_bench JSON files of the same card: for each ratio to
the GEMM of its own run (verify, greedy draft, sampled draft), the change per
row-count class (min / median / max of new − old over the shapes) and the
shapes that moved most. Usage: compare.py OLD.json NEW.json"""
import json
import statistics
import sys

RATIOS = ["verify_over_gemm", "draft_greedy_over_gemm", "draft_sampled_over_gemm"]
CLASSES = [("1–16", lambda r: r <= 16), ("64", lambda r: r == 64), ("256–512", lambda r: r >= 256)]


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data, {(r["V"], r["d"], r["rows"]): r for r in data["results"]}


def main(old_path, new_path):
    old_data, old = load(old_path)
    new_data, new = load(new_path)
    if old_data["device"] != new_data["device"]:
        sys.exit(f"different cards: {old_data['device']} and {new_data['device']}")
    shapes = sorted(set(old) & set(new))
    print(f"{new_data['device']}: {len(shapes)} shapes; change of each ratio (new − old), min · median · max\n")
    print("| rows | " + " | ".join(RATIOS) + " |")
    print("|---|" + "---|" * len(RATIOS))
    for name, match in CLASSES:
        sel = [s for s in shapes if match(s[2])]
        if not sel:
            continue
        cells = []
        for ratio in RATIOS:
            deltas = [new[s][ratio] - old[s][ratio] for s in sel]
            cells.append(f"{min(deltas):+.3f} · {statistics.median(deltas):+.3f} · {max(deltas):+.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    moved = sorted(shapes, key=lambda s: -abs(new[s]["verify_over_gemm"] - old[s]["verify_over_gemm"]))[:8]
    print("\nlargest moves of verify / GEMM:")
    for s in moved:
        print(f"  V={s[0]} d={s[1]} rows={s[2]}: {old[s]['verify_over_gemm']:.3f} -> {new[s]['verify_over_gemm']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
