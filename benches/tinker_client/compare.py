#!/usr/bin/env python3
"""Side-by-side medians of seed_loop.py (Python SDK) and examples/tinker_bench.rs (rlvr) runs.

    python compare.py --python py-1.json ... --rlvr rlvr-1.json ...

Both write summarize.py's JSON shape. Prints summarize.py's lines for each client (per run and
pooled), then a table of pooled per-step medians (wall, client CPU, server CPU, each phase's
wall and CPU) with the ratio Python / rlvr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import PHASES, line, mean, med  # noqa: E402


def load(paths: list[str]) -> list[tuple[str, list[dict]]]:
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append((path, [s for s in json.load(f)["steps"] if not s["warmup"]]))
    return runs


def figures(steps: list[dict]) -> dict[str, float]:
    out = {
        "wall": med(s["wall_s"] for s in steps),
        "client CPU": med(s["cpu_s"] for s in steps),
        # its kernel part (system time), when the client recorded it: a mean, the kernel
        # splits a process's CPU time into user and system by clock ticks (4 ms), too
        # coarse for one step
        "  of it kernel": mean(s.get("sys_s") for s in steps),
        "server CPU": med(s.get("server_cpu_s") for s in steps),
    }
    for p in PHASES:
        out[f"{p} wall"] = med(s["wall"][p] for s in steps)
        out[f"{p} CPU"] = med(s["cpu"][p] for s in steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", nargs="*", default=[])
    ap.add_argument("--rlvr", nargs="*", default=[])
    args = ap.parse_args()
    sides = [("Python SDK 0.38 loop", load(args.python)), ("rlvr GrpoTrainer", load(args.rlvr))]
    pooled = {}
    for name, runs in sides:
        if not runs:
            continue
        print(f"-- {name} (phase columns: wall/cpu ms, medians)")
        for path, steps in runs:
            print(line(os.path.basename(path)[:10], steps))
        steps = [s for _, st in runs for s in st]
        print(line("pooled", steps))
        pooled[name] = figures(steps)
    print()
    py, rs = pooled.get(sides[0][0]), pooled.get(sides[1][0])
    print(f"{'per step (median)':<18}" + "".join(f"{n:>22}" for n, _ in sides if n in pooled)
          + (f"{'Python/rlvr':>14}" if py and rs else ""))
    keys = (py or rs or {}).keys()
    for k in keys:
        row = f"{k:<18}"
        for side in (py, rs):
            if side is not None:
                row += f"{side[k] * 1e3:19.1f} ms"
        if py and rs:
            row += f"{py[k] / rs[k]:13.1f}x" if rs[k] > 0 else f"{'-':>14}"
        print(row)
    if rs:
        gap = rs["wall"] / (rs["client CPU"] + rs["server CPU"])
        print(f"\nrlvr: wall / (client CPU + server CPU) = {gap:.2f}")
    if py is None:
        print("(the Python loop was not run: rlvr's figures only)")


if __name__ == "__main__":
    main()
