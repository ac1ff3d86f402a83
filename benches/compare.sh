#!/usr/bin/env bash
# One command, both sides: rlvr's local backend (`cargo bench --bench local -- --compare`) and
# PyTorch eager on the CPU (`benches/pytorch_local.py`), same configs, same thread counts,
# one table of ratios.
#
#   benches/compare.sh [--quick] [--iters N] [--threads "1 2"] [--configs "bench realistic"]
#                      [--tune-allocator]
#
# --quick: the benchmark config only, 3 iterations (a few minutes on 2 cores); the default
# also runs the realistic config (hidden 1024, MLP 3072, 16/8 heads, 2 layers, vocabulary
# 32k, 4 x 512 tokens; batch-64 sampling of 128 tokens), which takes longer.
# rlvr runs with its default thread policy when the thread count is the machine's CPU count
# (no RAYON_NUM_THREADS / CANDLE_NUM_THREADS needed; any set in the environment are removed),
# else with `--threads N` (LocalOptions::threads). Each (config, threads) runs rlvr then
# PyTorch back to back. Ratios are rlvr / PyTorch (> 1: rlvr faster). "peak share" is the
# training FLOP/s over the best f32 GEMM FLOP/s measured at that thread count (either
# side's: the `gemm` crate, or torch.mm).
#
# rlvr runs as a library user gets it: the process's allocator left alone, unless
# --tune-allocator (LocalOptions::tune_allocator). The rlvr side's minor page faults and system
# CPU seconds per training step (getrusage) are listed under the table.
# PYTHON (default ~/.cache/rlvr-bench-venv/bin/python, else ~/.cache/rlvr-peer/venv/bin/python)
# must have torch and transformers. Figures are only comparable on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=5
THREADS="1 2"
CONFIGS="bench realistic"
TUNE=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) CONFIGS="bench"; ITERS=3 ;;
    --iters) ITERS="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --configs) CONFIGS="$2"; shift ;;
    --tune-allocator) TUNE=(--tune-allocator) ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for p in ~/.cache/rlvr-bench-venv/bin/python ~/.cache/rlvr-peer/venv/bin/python python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, transformers' 2>/dev/null; then
      PYTHON="$p"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "no python with torch + transformers (set PYTHON)" >&2; exit 1; }
unset RAYON_NUM_THREADS CANDLE_NUM_THREADS
NPROC=$(nproc)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "building the rlvr bench..." >&2
cargo bench --bench local --no-run >/dev/null 2>&1 || cargo bench --bench local --no-run
BIN=$(cargo bench --bench local --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $NPROC CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/machine"
echo "rlvr allocator: $([ ${#TUNE[@]} -gt 0 ] && echo 'tuned (--tune-allocator)' || echo 'left alone (the default)')" >>"$OUT/machine"
for c in $CONFIGS; do
  for t in $THREADS; do
    if [ "$t" = "$NPROC" ]; then tflag=(); else tflag=(--threads "$t"); fi
    echo "rlvr    config $c, $t threads..." >&2
    "$BIN" --compare --config "$c" "${tflag[@]}" "${TUNE[@]}" --iters "$ITERS" | sed "s/^/rlvr $c $t /" >>"$OUT/results"
    echo "pytorch config $c, $t threads..." >&2
    "$PYTHON" benches/pytorch_local.py --config "$c" --threads "$t" --iters "$ITERS" | sed "s/^/torch $c $t /" >>"$OUT/results"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine"
"$PYTHON" - "$OUT/results" "$OUT/machine" "$NPROC" <<'PY'
import sys
rows, flops, peak, order = {}, {}, {}, []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 5 or f[3] in ("rlvr", "torch"):
        continue
    side, cfg, t, name, value = f[0], f[1], f[2], f[3], float(f[4])
    key = (cfg, t, name)
    if key not in order:
        order.append(key)
    rows.setdefault(key, {})[side] = value
    if "flop/token" in line:
        flops[key] = float(f[6])
    if name == "gemm/peak":
        peak[(cfg, t)] = max(peak.get((cfg, t), 0.0), value)
print(open(sys.argv[2]).read().strip())
print(f"rlvr threads: the default policy at {sys.argv[3]} threads, LocalOptions::threads(n) otherwise")
print()
print("| config | threads | benchmark | rlvr | PyTorch | rlvr / PyTorch | rlvr peak share | PyTorch peak share |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
for key in order:
    cfg, t, name = key
    r = rows[key]
    a, b = r.get("rlvr"), r.get("torch")
    unit = "FLOP/s" if name == "gemm/peak" else "tok/s"
    fmt = (lambda v: f"{v / 1e9:.1f} G{unit}") if name == "gemm/peak" else (lambda v: f"{v:,.0f} {unit}")
    ratio = f"{a / b:.2f}x" if a and b else "-"
    share_a = share_b = ""
    if key in flops and (cfg, t) in peak:
        share_a = f"{a * flops[key] / peak[(cfg, t)]:.0%}" if a else ""
        share_b = f"{b * flops[key] / peak[(cfg, t)]:.0%}" if b else ""
    print(f"| {cfg} | {t} | {name} | {fmt(a) if a else '-'} | {fmt(b) if b else '-'} | {ratio} | {share_a} | {share_b} |")
usage = []
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "rlvr" and "faults/iter" in f and f[3].startswith("train/"):
        i = f.index("faults/iter")
        usage.append(f"| {f[1]} | {f[2]} | {f[3]} | {float(f[i - 1]):,.0f} | {float(f[i + 1]):.3f} |")
if usage:
    print()
    print("| config | threads | rlvr benchmark | minor page faults / step | system CPU s / step |")
    print("|---|---:|---|---:|---:|")
    print("\n".join(usage))
PY
