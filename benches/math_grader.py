#!/usr/bin/env python3
"""Speed of the tinker-cookbook's two math graders on the labelled pairs of
`tests/fixtures/math_grader/pairs.jsonl`, the Python side of the Rust grader's benchmark.

    ~/.cache/rlvr-math-venv/bin/python benches/math_grader.py [--limit N] [--timeout 5] [--keep-caches] [--json]

Needs only the venv of `tests/fixtures/math_grader/make_pairs.py` (tinker-cookbook 0.6.1 with
sympy, pylatexenc and math-verify; see its docstring) and the fixture. Run from the repository
root. `--limit N` times N pairs spread evenly over the file (which is sorted by kind), so a short
run still covers every answer shape.

Both graders, `math_grading.grade_answer` ("sympy") and `math_grading.grade_answer_math_verify`
("math_verify"), run in this process, one thread (the main one: math-verify's own timeouts use
`signal.alarm`). Each is first run once over the pairs as a warm-up (imports, lazily built
parsers); then the caches both keep (sympy's expression cache, math-verify's LRU caches of parsed
strings) are cleared so the timed pass parses every pair afresh, as training does for new
samples; pass `--keep-caches` to time the warm-cache case instead. Each call is timed on its own
with `time.perf_counter`; a call that runs past `--timeout` seconds (default 5, as the
cookbook's `run_with_timeout_signal`) is interrupted with SIGALRM and counts the timeout as its
latency (math-verify re-arms the one process alarm for its own 5 s step timeouts, so such a call
may run longer than `--timeout`; it still counts `--timeout`). The total is the sum of the
per-pair latencies. Reports per grader: total seconds, pairs/s, p50 and p99 latency per pair, the timeouts
and the exceptions (which the cookbook counts as False).
"""

import argparse
import gc
import json
import logging
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "math_grader", "pairs.jsonl")


class _Timeout(BaseException):  # not caught by the graders' own `except Exception`
    pass


def _alarm(signum, frame):
    raise _Timeout()


def call(fn, given, truth, timeout):
    """(seconds, outcome) of one grader call; outcome is True, False, 'timeout' or 'error'."""
    # math-verify sets (and then cancels) its own alarm inside; ours is armed with setitimer
    # around the whole call, and re-armed below if the call cancelled it.
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        out = bool(fn(given, truth))
    except _Timeout:
        out = "timeout"
    except Exception:  # noqa: BLE001 -- the cookbook counts an exception as False
        out = "error"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    dt = time.perf_counter() - t0
    if out != "timeout" and dt > timeout:
        out = "timeout"  # math-verify's inner alarm displaced ours and the call ran long anyway
    if out == "timeout":
        dt = timeout  # what a caller waiting `timeout` seconds (the cookbook's safe_grade) loses
    return dt, out


def clear_caches():
    import sympy.core.cache
    from math_verify import parser as mv_parser

    sympy.core.cache.clear_cache()
    for name in dir(mv_parser):
        obj = getattr(mv_parser, name)
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()
    try:
        from latex2sympy2_extended import latex2sympy2 as l2s

        for name in dir(l2s):
            obj = getattr(l2s, name)
            if hasattr(obj, "cache_clear"):
                obj.cache_clear()
    except ImportError:
        pass


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default=FIXTURE)
    ap.add_argument("--limit", type=int, default=0, help="only N pairs, evenly spaced over the fixture")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per call before it counts as a timeout")
    ap.add_argument("--keep-caches", action="store_true", help="do not clear the parse caches after the warm-up")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()

    logging.disable(logging.CRITICAL)
    from tinker_cookbook.recipes.math_rl.math_grading import grade_answer, grade_answer_math_verify

    graders = {"sympy": grade_answer, "math_verify": grade_answer_math_verify}
    with open(args.fixture, encoding="utf-8") as f:
        pairs = [json.loads(line) for line in f if line.strip()]
    if args.limit and args.limit < len(pairs):
        # evenly spaced over the file (it is sorted by kind), so that every kind is represented
        pairs = [pairs[i * len(pairs) // args.limit] for i in range(args.limit)]
    signal.signal(signal.SIGALRM, _alarm)

    report = {"pairs": len(pairs), "timeout_s": args.timeout, "caches_cleared": not args.keep_caches,
              "python": sys.version.split()[0], "graders": {}}
    for name, fn in graders.items():
        for p in pairs:  # warm-up
            call(fn, p["given"], p["truth"], args.timeout)
        if not args.keep_caches:
            clear_caches()
        gc.collect()
        lat = []
        timeouts = errors = accepted = 0
        for p in pairs:
            dt, out = call(fn, p["given"], p["truth"], args.timeout)
            lat.append(dt)
            timeouts += out == "timeout"
            errors += out == "error"
            accepted += out is True
        total = sum(lat)
        report["graders"][name] = {
            "total_s": round(total, 4),
            "pairs_per_s": round(len(pairs) / total, 2) if total > 0 else None,
            "p50_ms": round(1e3 * pct(lat, 0.5), 4),
            "p99_ms": round(1e3 * pct(lat, 0.99), 4),
            "mean_ms": round(1e3 * statistics.fmean(lat), 4) if lat else None,
            "max_ms": round(1e3 * max(lat), 4) if lat else None,
            "timeouts": timeouts,
            "errors": errors,
            "accepted": accepted,
        }
    if args.json:
        print(json.dumps(report))
        return
    print(f"{len(pairs)} pairs from {os.path.relpath(args.fixture)}, one thread, timeout {args.timeout:g} s, "
          f"caches {'kept' if args.keep_caches else 'cleared'} after the warm-up")
    print(f"{'grader':<12} {'total s':>9} {'pairs/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'timeouts':>9} {'errors':>7}")
    for name, r in report["graders"].items():
        print(f"{name:<12} {r['total_s']:>9.3f} {r['pairs_per_s']:>9.1f} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} "
              f"{r['max_ms']:>9.1f} {r['timeouts']:>9} {r['errors']:>7}")


if __name__ == "__main__":
    main()
