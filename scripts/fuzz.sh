#!/usr/bin/env bash
# Runs silvic-net's cargo-fuzz targets, each for a bounded time, and prints what each did.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]    (default: 20 s, every target)
#
# Installs cargo-fuzz if it is missing. cargo-fuzz needs nightly compiler flags; on the stable
# toolchain RUSTC_BOOTSTRAP=1 allows them. Builds with debug assertions, so an integer overflow
# is a crash. New inputs go to fuzz/target/corpus/<target> (not checked in), reading the seeds
# in fuzz/corpus/<target>; a crash leaves its input in fuzz/artifacts/<target>/ and makes the
# script exit non-zero after every target has run. To keep a crash as a regression test, copy its
# input into fuzz/corpus/<target>/ (tests/corpus.rs replays those on stable).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(frame_decode abort_decode handshake_decode handshake_roles ring_frames exchange_rank0)
fi
export RUSTC_BOOTSTRAP=1 CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked --version 0.13.2
fi

build_started=$SECONDS
mkdir -p target
if ! cargo fuzz build --debug-assertions >target/fuzz-build.log 2>&1; then
    tail -n 40 target/fuzz-build.log
    exit 1
fi
echo "built in $((SECONDS - build_started)) s"

failed=()
summary=()
for target in "${targets[@]}"; do
    mkdir -p "target/corpus/$target" "artifacts/$target"
    log="target/fuzz-$target.log"
    status=0
    # -timeout: an input taking this long is a hang (ring_frames forms a loopback ring per input,
    # exchange_rank0 a loopback exchange, so they get longer). -malloc_limit_mb: one allocation above 64 MiB is a crash, so no length a
    # peer claims can size an allocation. -rss_limit_mb: memory bounded.
    timeout=1
    [ "$target" = ring_frames ] && timeout=10
    [ "$target" = exchange_rank0 ] && timeout=10
    cargo fuzz run --debug-assertions "$target" "target/corpus/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout="$timeout" -malloc_limit_mb=64 \
        -rss_limit_mb=1024 -print_final_stats=1 >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | tr -dc 0-9)
    units=$(find "target/corpus/$target" -type f | wc -l)
    line="$target: ${seconds}s, ${execs:-?} execs, cov ${cov:-?}, corpus $units"
    if [ "$status" -ne 0 ]; then
        line="$line: FAILED (exit $status), see fuzz/$log and fuzz/artifacts/$target/"
        failed+=("$target")
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -n 5 || true
    fi
    echo "$line"
    summary+=("$line")
done

printf '\nfuzz summary\n'
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    echo "failing targets: ${failed[*]}"
    exit 1
fi
