#!/usr/bin/env bash
# A fuzzing campaign: every target of fuzz/ for SECONDS each (default 600), one after the
# other, one process each. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Corpora grow in fuzz/corpus/<target> (not committed),
# crashes land in fuzz/artifacts/<target>; a summary line per target goes to
# fuzz/campaign.log.
#
#   fuzz/campaign.sh            # 10 minutes per target
#   fuzz/campaign.sh 60 boxed   # one target, one minute
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-600}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(boxed gsm8k_answer parse_response tinker_decode run_dir_readers math_grader)
fi
cargo +nightly fuzz build
log=campaign.log
echo "# $(date -u +%FT%TZ) $(nproc) cores, ${seconds}s per target" >>"$log"
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  start=$(date +%s)
  set +e
  cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" \
    -print_final_stats=1 >"run-$t.log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "run-$t.log" | grep -o '[0-9]*$' | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "run-$t.log" | tail -n1)
  crashes=$(find "artifacts/$t" -type f | wc -l)
  echo "$t: rc=$rc wall=$((end - start))s execs=${execs:-?} ${cov:-cov: ?} corpus=$(ls "corpus/$t" | wc -l) artifacts=$crashes" | tee -a "$log"
done
