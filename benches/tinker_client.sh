#!/usr/bin/env bash
# Tinker client, side by side: the Python SDK 0.38 tutorial loop and rlvr's GrpoTrainer on the
# Tinker backend, against the same instant fake Tinker server, same sizes (16 problems x 8
# samples x 256 tokens, 1 warm-up + N measured steps), server pinned to one CPU and each
# client to another. Prints per-step medians (wall, client CPU, server CPU, per phase) and
# the ratios Python / rlvr. Method and figures: docs/performance.md ("Tinker client vs the Python SDK loop").
#
#   benches/tinker_client.sh [--steps N] [--runs R] [--data DIR] [--python PY] [--rust-only]
#                            [--glibc-malloc] [--lto] [--http-floor]
#                            [--against REV|BIN [--instructions]]
#
#   --data DIR     GSM8K directory with train.jsonl (default ../shared/data/gsm8k; the server
#                  looks the ground truths up there, both clients read their problems from it)
#   --tokenizer F  Qwen3 tokenizer.json (default: tests/fixtures/qwen3-tokenizer.json.zst,
#                  decompressed into the work directory)
#   --python PY    a Python that already has the packages below (skips the venv)
#   --rust-only    don't run the Python loop (the server still needs Python)
#   --steps N      measured steps per run (default 10); --runs R runs per client (default 1)
#   --cpus S,C     CPU of the server and of the clients (default 0,1)
#   --latency-ms L the server answers every request (each future poll too) L ms later
#                  (default 0: instant); shows how much of the latency each client overlaps
#   --glibc-malloc rlvr's driver with the C library's malloc instead of mimalloc (the
#                  allocator of the Tinker examples); built into a target directory of its own
#   --lto          rlvr's driver built with fat link-time optimization and one codegen unit
#                  (what a user can set in the release profile of the binary that depends on
#                  rlvr); built into a target directory of its own
#   --http-floor   afterwards, the client CPU of one HTTP request on this machine against the
#                  same server: reqwest as rlvr configures it and hyper-util's pooled client
#                  alternating (benches/tinker_client/http_floor, a package of its own)
#   --against X    rlvr against another rlvr instead of the Python loop: X is a git revision
#                  (its examples/tinker_bench.rs built from a git worktree under the work
#                  directory, into a target directory of its own; `git worktree prune`
#                  forgets it once removed) or a tinker_bench binary. --runs R rounds, each
#                  one run of both drivers back to back against the same server in
#                  alternating order (ABBA); prints each round's medians and the median
#                  ratio this / other
#   --instructions with --against: user-space instructions per step instead (valgrind's
#                  callgrind; repeatable whatever the host's load): for each driver, a 1-step
#                  and a (1 + N)-step run, each against a fresh server (the same completions),
#                  the difference divided by N
#
# Environment: RLVR_BENCH_VENV (default ~/.cache/rlvr-bench-venv) is created when missing,
# with `uv` when present, else `python -m venv` + pip, from the package index:
#   server:      tinker==0.38.0 numpy tokenizers zstandard
#   Python loop: + torch transformers pillow datasets, tinker-cookbook==0.6.1 (--no-deps when
#                its `tml-renderers` dependency does not resolve, as
#                tests/fixtures/renderers/make_fixtures.sh does)
# When the Python loop's packages cannot be installed, the script says so and prints rlvr's
# figures alone. CARGO_TARGET_DIR is honoured. Work files go to $RLVR_BENCH_OUT (default
# target/tinker-client-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
here=$root/benches/tinker_client
steps=10; runs=1; data=$root/../shared/data/gsm8k; tokenizer=""; py=""; rust_only=0
cpus=0,1; port=${RLVR_BENCH_PORT:-8799}; latency=0; glibc_malloc=0; http_floor=0; lto=0
against=""; instructions=0
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --rust-only) rust_only=1; shift ;;
    --cpus) cpus=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --latency-ms) latency=$2; shift 2 ;;
    --glibc-malloc) glibc_malloc=1; shift ;;
    --lto) lto=1; shift ;;
    --http-floor) http_floor=1; shift ;;
    --against) against=$2; shift 2 ;;
    --instructions) instructions=1; shift ;;
    -h|--help) sed -n 2,50p "$0" | sed "s|^# \{0,1\}||"; exit 0 ;;
    *) echo "tinker_client.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
server_cpu=${cpus%,*}; client_cpu=${cpus#*,}
[ $instructions = 0 ] || [ -n "$against" ] || { echo "tinker_client.sh: --instructions needs --against" >&2; exit 2; }
[ $instructions = 0 ] || command -v valgrind >/dev/null || { echo "tinker_client.sh: --instructions needs valgrind" >&2; exit 1; }
# rlvr against rlvr: no Python loop (its packages are not needed)
[ -z "$against" ] || rust_only=1
out=${RLVR_BENCH_OUT:-$root/target/tinker-client-bench}
mkdir -p "$out"
[ -f "$data/train.jsonl" ] || { echo "tinker_client.sh: no $data/train.jsonl (pass --data DIR)" >&2; exit 1; }
pin() { if command -v taskset >/dev/null; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }

# --- Python environment ---------------------------------------------------------------
have_server() { "$1" -c 'import tinker, numpy, tokenizers' >/dev/null 2>&1; }
have_loop() { "$1" -c 'import tinker, torch, transformers, datasets, tinker_cookbook.renderers' >/dev/null 2>&1; }
if [ -z "$py" ]; then
  venv=${RLVR_BENCH_VENV:-$HOME/.cache/rlvr-bench-venv}
  py=$venv/bin/python
  base=""
  for c in "$HOME"/.pyenv/versions/3.12*/bin/python python3.12 python3.13 python3; do
    if "$c" -c 'import sys; assert sys.version_info >= (3, 11)' >/dev/null 2>&1; then base=$c; break; fi
  done
  if command -v uv >/dev/null; then
    mk() { [ -x "$py" ] || uv venv -q -p "$base" "$venv"; }; pipi() { uv pip install -q -p "$py" "$@"; }
  else
    mk() { [ -x "$py" ] || "$base" -m venv "$venv"; }; pipi() { "$py" -m pip install -q "$@"; }
  fi
  if ! have_server "$py"; then
    [ -n "$base" ] || { echo "tinker_client.sh: needs Python >= 3.11 for the fake server" >&2; exit 1; }
    echo "== creating $venv (server packages)"
    mk && pipi tinker==0.38.0 numpy tokenizers zstandard
  fi
  if [ $rust_only = 0 ] && ! have_loop "$py"; then
    echo "== installing the Python loop's packages into $venv (torch is large)"
    pipi torch transformers pillow datasets || true
    pipi tinker-cookbook==0.6.1 2>/dev/null || pipi --no-deps tinker-cookbook==0.6.1 || true
    # what the cookbook's renderers import when installed without its dependencies
    have_loop "$py" || pipi chz blobfile rich termcolor safetensors jinja2 tiktoken pydantic || true
  fi
fi
have_server "$py" || { echo "tinker_client.sh: $py lacks tinker==0.38.0/numpy/tokenizers" >&2; exit 1; }
if [ $rust_only = 0 ] && ! have_loop "$py"; then
  echo "!! the Python loop's packages (torch, transformers, datasets, tinker-cookbook) could not be"
  echo "!! installed into $py: printing rlvr's figures only"
  rust_only=1
fi

# --- tokenizer -----------------------------------------------------------------------------
if [ -z "$tokenizer" ]; then
  tokenizer=$out/qwen3/tokenizer.json
  if [ ! -f "$tokenizer" ]; then
    mkdir -p "$out/qwen3"
    "$py" -c 'import sys, zstandard; open(sys.argv[2], "wb").write(zstandard.ZstdDecompressor().decompress(open(sys.argv[1], "rb").read(), max_output_size=1 << 30))' \
      "$root/tests/fixtures/qwen3-tokenizer.json.zst" "$tokenizer"
  fi
fi

# --- rlvr's driver -------------------------------------------------------------------------
target=${CARGO_TARGET_DIR:-$root/target}
if [ $glibc_malloc = 1 ]; then
  # Other RUSTFLAGS rebuild every crate: a target directory of their own keeps the default one.
  target=$target/glibc-malloc
  export RUSTFLAGS="${RUSTFLAGS:-} --cfg rlvr_glibc_malloc"
fi
if [ $lto = 1 ]; then
  # Profile settings through the environment: this build's artefacts differ in every crate.
  target=$target/lto
  export CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
fi
echo "== building examples/tinker_bench.rs (release$([ $glibc_malloc = 1 ] && echo ', glibc malloc')$([ $lto = 1 ] && echo ', fat LTO'))"
(cd "$root" && CARGO_TARGET_DIR=$target cargo build --release --no-default-features --features tinker \
  --example tinker_bench) >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }
bin=$target/release/examples/tinker_bench
other_bin=""
if [ -n "$against" ]; then
  if [ -f "$against" ] && [ -x "$against" ]; then
    other_bin=$(cd "$(dirname "$against")" && pwd)/$(basename "$against")
  else
    rev=$(git -C "$root" rev-parse --verify --quiet "$against^{commit}") \
      || { echo "tinker_client.sh: --against $against is neither a binary nor a git revision" >&2; exit 2; }
    tree=$out/against/$rev
    [ -d "$tree" ] || git -C "$root" worktree add -q --detach "$tree" "$rev"
    echo "== building examples/tinker_bench.rs at ${rev:0:12} (release, same options)"
    # A target directory of its own: in the same one, cargo takes the two checkouts' rlvr
    # for one package, and each build's output for the other's (the first build here
    # compiles the dependencies too).
    (cd "$tree" && CARGO_TARGET_DIR=$target/against cargo build --release --no-default-features \
      --features tinker --example tinker_bench) >"$out/build-against.log" 2>&1 \
      || { tail -30 "$out/build-against.log" >&2; exit 1; }
    other_bin=$target/against/release/examples/tinker_bench
  fi
fi
if [ $http_floor = 1 ]; then
  echo "== building benches/tinker_client/http_floor (release)"
  (cd "$here/http_floor" && CARGO_TARGET_DIR=$target cargo build --release) >"$out/build-http-floor.log" 2>&1 \
    || { tail -30 "$out/build-http-floor.log" >&2; exit 1; }
fi

# --- the server ----------------------------------------------------------------------------
server_cmd=("$py" "$here/fake_tinker_server.py" --port "$port" --tokenizer "$tokenizer"
  --answers "$data/train.jsonl" --latency-ms "$latency")
machine="$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
server=""
start_server() {
  # taskset started here, not through pin(), so that $! is the server itself
  if command -v taskset >/dev/null; then
    taskset -c "$server_cpu" "${server_cmd[@]}" >"$out/server.log" 2>&1 &
  else
    "${server_cmd[@]}" >"$out/server.log" 2>&1 &
  fi
  server=$!
  for _ in $(seq 1 100); do
    "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/bench/stats', timeout=1)" 2>/dev/null && return 0
    kill -0 $server 2>/dev/null || { cat "$out/server.log" >&2; exit 1; }
    sleep 0.3
  done
  echo "tinker_client.sh: the fake server did not answer on port $port" >&2; exit 1
}
stop_server() { [ -z "$server" ] || { kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; server=""; }; }
trap stop_server EXIT
url=http://127.0.0.1:$port

# --- instructions per step (--against ... --instructions) ----------------------------------
if [ $instructions = 1 ]; then
  echo "machine: $machine; valgrind $(valgrind --version)"
  for side in this other; do
    if [ $side = this ]; then b=$bin; else b=$other_bin; fi
    counts=()
    for n in 1 $((steps + 1)); do
      start_server
      pin "$client_cpu" valgrind --tool=callgrind --callgrind-out-file="$out/callgrind-$side-$n.out" \
        "$b" --base-url "$url" --tokenizer "$tokenizer" --data "$data" --steps "$n" --warmup 0 \
        --bench-json "$out/callgrind-$side-$n.json" >"$out/callgrind-$side-$n.log" 2>&1 \
        || { tail -20 "$out/callgrind-$side-$n.log" >&2; exit 1; }
      stop_server
      counts+=("$(sed -n 's/^summary: //p' "$out/callgrind-$side-$n.out")")
    done
    echo "$side: instructions a step $(( (counts[1] - counts[0]) / steps )) (a 1-step run ${counts[0]}, a $((steps + 1))-step run ${counts[1]})"
  done
  exit 0
fi

start_server

# --- the runs ------------------------------------------------------------------------------
rlvr_run() { # binary, JSON file, log file
  pin "$client_cpu" "$1" --base-url "$url" --tokenizer "$tokenizer" --data "$data" \
    --steps "$steps" --bench-json "$2" >"$3" 2>&1 || { cat "$3" >&2; exit 1; }
}
if [ -n "$against" ]; then
  this_files=(); other_files=()
  for r in $(seq 1 "$runs"); do
    if [ $((r % 2)) = 1 ]; then order="this other"; else order="other this"; fi
    echo "== round $r: $order"
    for side in $order; do
      if [ $side = this ]; then b=$bin; else b=$other_bin; fi
      rlvr_run "$b" "$out/ab-$side-$r.json" "$out/ab-$side-$r.log"
    done
    this_files+=("$out/ab-this-$r.json"); other_files+=("$out/ab-other-$r.json")
  done
  echo
  echo "machine: $machine; server on CPU $server_cpu, client on CPU $client_cpu"
  echo "this: $bin; other: $other_bin ($against)"
  "$py" "$here/ab.py" --this "${this_files[@]}" --other "${other_files[@]}"
  exit 0
fi
py_files=(); rs_files=()
for r in $(seq 1 "$runs"); do
  if [ $rust_only = 0 ]; then
    echo "== Python SDK loop, run $r"
    pin "$client_cpu" "$py" "$here/seed_loop.py" --base-url "$url" --tokenizer "$tokenizer" \
      --data "$data/train.jsonl" --steps "$steps" --idle 0 --json-out "$out/python-$r.json" \
      >"$out/python-$r.log" 2>&1 || { cat "$out/python-$r.log" >&2; exit 1; }
    py_files+=("$out/python-$r.json")
  fi
  echo "== rlvr GrpoTrainer (Tinker backend), run $r"
  rlvr_run "$bin" "$out/rlvr-$r.json" "$out/rlvr-$r.log"
  rs_files+=("$out/rlvr-$r.json")
done

"$py" - "$url" <<'EOF'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(sys.argv[1] + "/bench/stats", timeout=5))
bad = {k: v for k, v in s.items() if "miss" in k or "mismatch" in k}
bad.update({f"fwd.{k}": v for k, v in (s.get("fwd") or {}).items() if "mismatch" in k})
print("server checks (expect zeros):", bad or "n/a")
EOF
echo
echo "machine: $machine; server on CPU $server_cpu, client on CPU $client_cpu"
"$py" "$here/compare.py" --python "${py_files[@]}" --rlvr "${rs_files[@]}"
if [ $http_floor = 1 ]; then
  echo
  pin "$client_cpu" "$target/release/http-floor" --url "$url/api/v1/healthz"
fi
