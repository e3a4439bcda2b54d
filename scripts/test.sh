#!/usr/bin/env bash
# The tests of the workspace, as README.md gives them and .ci/run runs them. Needs only the Rust
# toolchain: installs cargo-nextest (the test runner, which bounds every test in time) with
# `cargo install --locked` the first time.
#
#     scripts/test.sh                  # every test a non-root machine can run
#     scripts/test.sh --profile ci     # as root with iproute2 and nftables: the namespace tests too
#
# Arguments go to both nextest runs (`--profile ci`, a filter expression...). Every step is
# --locked: it builds what Cargo.lock says.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each command is printed before it runs, so a log (CI's among them) shows what ran.
run() {
  printf '+ %s\n' "$*" >&2
  "$@"
}

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "scripts/test.sh: installing cargo-nextest (cargo install --locked cargo-nextest), once" >&2
  cargo install --locked cargo-nextest
fi

# Unit, loopback, failure and multi-process tests.
run cargo nextest run --workspace --locked "$@"
# The examples of README.md and docs/ (each page with a Rust example is a doctest of silvic-net).
run cargo test --workspace --doc --locked
# The unit tests again on the optimized build users run: the bitwise tests must hold where the
# optimizer vectorizes the folds (it may swap an add's operands; silvic-core's fold.rs).
run cargo nextest run --release -p silvic-core -p silvic-net --lib --locked "$@"
