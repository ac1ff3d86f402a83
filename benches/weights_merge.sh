#!/usr/bin/env bash
# Merging a LoRA adapter into its base model, side by side with the cookbook: a random model
# with Qwen3-0.6B's shapes (bf16, two shards, 1.5 GB) and a rank-32 Tinker adapter on every
# linear layer and the output head (benches/weights_merge.py make), merged by rlvr
# (`examples/weights.rs convert`, release build) and by tinker-cookbook 0.6.1's
# `weights.build_hf_model` (PyTorch on every core); wall time and peak memory of each
# (/usr/bin/time), then the two outputs compared tensor for tensor. Figures: docs/weights.md.
#
#   benches/weights_merge.sh [--python PY]
#
#   --python PY   a Python with torch, safetensors, transformers and tinker-cookbook 0.6.1
#                 (--no-deps) (default: a venv made in ~/.cache/rlvr-weights-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
py=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$py" ]; then
  venv="$HOME/.cache/rlvr-weights-venv"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tinker_cookbook, torch, transformers, safetensors" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-deps tinker-cookbook==0.6.1
    "$venv/bin/pip" install -q torch transformers safetensors
  fi
  py="$venv/bin/python"
fi
cargo build --quiet --release --example weights
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" benches/weights_merge.py make "$work"
du -sh "$work/base" "$work/adapter"
peak() { grep "Maximum resident" "$1" | awk '{printf "%.0f MiB", $6/1024}'; }
wall() { grep "Elapsed (wall" "$1" | awk '{print $NF}'; }
# Warm the page cache for both.
cat "$work"/base/*.safetensors >/dev/null
/usr/bin/time -v target/release/examples/weights convert "$work/adapter" --base "$work/base" \
  --merged "$work/rlvr" >/dev/null 2>"$work/rlvr.time"
/usr/bin/time -v "$py" benches/weights_merge.py cookbook "$work" "$work/cookbook" 2>"$work/py.time"
"$py" benches/weights_merge.py compare "$work/rlvr" "$work/cookbook"
echo "rlvr      : wall $(wall "$work/rlvr.time"), peak RSS $(peak "$work/rlvr.time")"
echo "cookbook  : wall $(wall "$work/py.time"), peak RSS $(peak "$work/py.time")"
