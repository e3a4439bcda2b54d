#!/usr/bin/env bash
# Runs the multi-host fault tests by hand: four (or eight) network namespaces on a bridge, one rank
# process per namespace, faults injected while collectives run. Prints one row per rank and
# fault ("FAULT <fault> | rank <r> | <outcome> | <seconds to error>"); pipe it through
# `grep ^FAULT` for the table alone.
#
#   sudo scripts/netns-faults.sh            # every fault (about 2.5 minutes)
#   sudo scripts/netns-faults.sh sigkill    # the tests whose names contain "sigkill"
#
# Needs root, iproute2 (ip, tc) and nftables. Removes leftovers of killed runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "needs root (network namespaces); try: sudo $0 $*" >&2
  exit 1
fi
for tool in ip tc nft; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install iproute2 nftables" >&2; exit 1; }
done
bash scripts/netns-sweep.sh
cargo test -p silvic-testbed --test netns_faults --test netns_chords -- --nocapture --test-threads 8 "$@"
