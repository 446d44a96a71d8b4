#!/usr/bin/env bash
# Run the fuzz targets: `fuzz/run.sh [SECONDS] [TARGET...]` (default 60 s
# each, every target). Needs cargo-fuzz (`cargo install cargo-fuzz`) and a
# nightly toolchain (for the sanitizer flags); not part of .ci/run.
# Prints each target's executions and whether it crashed; crashes are left
# in fuzz/artifacts/<target>/. FUZZ_SANITIZER=none builds without
# AddressSanitizer (the code is safe Rust: about 3x the executions);
# FUZZ_JOBS=N runs N workers.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder message_decode dispatch)
# The dispatch target reads beneath this tree; the seeds name it.
cargo +nightly run --quiet --bin make_seeds
status=0
for t in "${targets[@]}"; do
    log="target/fuzz-$t.log"
    mkdir -p target
    # New inputs go to target/corpus-<t>; corpus/<t> (the seeds) is only read.
    mkdir -p "target/corpus-$t"
    if cargo +nightly fuzz run -s "${FUZZ_SANITIZER:-address}" "$t" "target/corpus-$t" "corpus/$t" -- \
        -max_total_time="$secs" ${FUZZ_JOBS:+-fork="$FUZZ_JOBS"} \
        -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=CRASHED
        status=1
    fi
    execs=$(grep -aE '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "$t: $result, ${execs:-?} executions in ${secs}s (log: fuzz/$log)"
done
exit $status
