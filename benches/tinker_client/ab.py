#!/usr/bin/env python3
"""Two rlvr drivers run in alternating rounds against one fake server (tinker_client.sh --against).

    python ab.py --this this-1.json this-2.json ... --other other-1.json other-2.json ...

Round r is this-r and other-r (run back to back, in alternating order: ABBA). Prints each
round's median client CPU per step (and the server's, which shows how noisy the host was
during each run), then the median over the rounds of this / other, its range, in how many
rounds this was lower, and the pooled medians of both. On a shared host a difference of a
few percent needs many rounds: a single pair of runs moves by 10-20 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import load  # noqa: E402
from summarize import med  # noqa: E402


def ms(values) -> float:
    return med(values) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--this", nargs="+", required=True)
    ap.add_argument("--other", nargs="+", required=True)
    args = ap.parse_args()
    if len(args.this) != len(args.other):
        sys.exit("ab.py: --this and --other need as many runs each")
    this, other = load(args.this), load(args.other)
    ratios = []
    for r, ((_, sa), (_, sb)) in enumerate(zip(this, other), 1):
        ca, cb = ms(s["cpu_s"] for s in sa), ms(s["cpu_s"] for s in sb)
        ratios.append(ca / cb)
        print(
            f"round {r:2}: this {ca:6.2f} ms (server {ms(s['server_cpu_s'] for s in sa):5.1f})"
            f"  other {cb:6.2f} ms (server {ms(s['server_cpu_s'] for s in sb):5.1f})"
            f"  this/other {ca / cb:.3f}"
        )
    pooled_a = ms(s["cpu_s"] for _, st in this for s in st)
    pooled_b = ms(s["cpu_s"] for _, st in other for s in st)
    print(
        f"client CPU per step, this / other: median of {len(ratios)} rounds "
        f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}; "
        f"this lower in {sum(x < 1 for x in ratios)} of {len(ratios)}); "
        f"pooled medians {pooled_a:.2f} / {pooled_b:.2f} ms"
    )


if __name__ == "__main__":
    main()
