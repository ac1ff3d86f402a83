#!/usr/bin/env bash
# The competition-math grader, side by side with the cookbook's graders: every pair of
# tests/fixtures/math_grader/pairs.jsonl graded on one thread by rlvr's three modes
# (benches/math_grader.rs, release build) and by the cookbook's `grade_answer` (sympy) and
# `grade_answer_math_verify` (benches/math_grader.py), then the ratios. Figures and method:
# docs/grading.md ("Speed").
#
#   benches/math_grader.sh [--python PY] [--limit N]
#
#   --python PY   a Python with tinker-cookbook 0.6.1 (--no-deps), sympy, pylatexenc and
#                 math-verify (default: a venv made in ~/.cache/rlvr-math-venv from the
#                 package index)
#   --limit N     only the first N pairs
set -euo pipefail
cd "$(dirname "$0")/.."
py=""
limit=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py="$2"; shift 2 ;;
    --limit) limit=(--limit "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$py" ]; then
  venv="$HOME/.cache/rlvr-math-venv"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tinker_cookbook, sympy, math_verify, pylatexenc" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-deps tinker-cookbook==0.6.1
    "$venv/bin/pip" install -q sympy pylatexenc math-verify lark
  fi
  py="$venv/bin/python"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo bench --quiet --bench math_grader -- --json "${limit[@]}" >"$work/rust.json"
"$py" benches/math_grader.py --json "${limit[@]}" >"$work/python.json"
"$py" - "$work/rust.json" "$work/python.json" <<'PY'
import json, sys
rust = json.load(open(sys.argv[1]))
python = json.load(open(sys.argv[2]))["graders"]
print(f"{rust['pairs']} pairs, one thread")
print(f"{'grader':<24} {'pairs/s':>12} {'p50 µs':>10} {'p99 µs':>10} {'max µs':>10}")
for mode in ("sympy", "math_verify", "best"):
    r = rust[mode]
    print(f"{'rlvr ' + mode:<24} {r['pairs_per_s']:>12.0f} {r['p50_us']:>10.1f} {r['p99_us']:>10.1f} {r['max_us']:>10.1f}")
for mode in ("sympy", "math_verify"):
    p = python[mode]
    print(f"{'cookbook ' + mode:<24} {p['pairs_per_s']:>12.1f} {1e3 * p['p50_ms']:>10.1f} {1e3 * p['p99_ms']:>10.1f} {1e3 * p['max_ms']:>10.1f}")
print()
for mode, against in (("sympy", "sympy"), ("math_verify", "math_verify"), ("best", "sympy"), ("best", "math_verify")):
    r, p = rust[mode], python[against]
    print(f"rlvr {mode} vs cookbook {against}: {r['pairs_per_s'] / p['pairs_per_s']:,.0f}x the pairs per second, "
          f"p99 {1e3 * p['p99_ms'] / r['p99_us']:,.0f}x lower")
print()
print("inputs built to explode, slowest grading in any mode (µs):")
for name, us in rust["explosive_worst_us"].items():
    print(f"  {name:<28} {us:>10.1f}")
PY
