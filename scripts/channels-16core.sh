#!/usr/bin/env bash
# The channel measurements that need a many-core machine (16 cores or more), as files in OUT
# (default ./channels-results): namespace hosts at 25 and 100 Gbit/s, worlds 4 and 8, 2 to 64
# MiB, with channels chosen and with one channel, CPU per call included; the links' own limit;
# and loopback at 16 MiB, worlds 4 and 8, against torch.distributed's Gloo, interleaved.
#
# Run as root (the namespace hosts need it) from the repository root:
#   sudo scripts/channels-16core.sh [OUT]
# Needs iproute2 and nftables; the Gloo rounds need python3 with torch, and the peers' scripts
# at PEERS (default ../shared/peers). Rounds (default 3) interleave the builds compared, so a
# neighbour's load falls on both alike.
set -euo pipefail
OUT=${1:-channels-results}
PEERS=${PEERS:-../shared/peers}
ROUNDS=${ROUNDS:-3}
# The namespace hosts all run on this one machine, so each rank sees every core: auto gives
# each rank up to 8 channels; fixed counts show the curve.
COUNTS=${COUNTS:-auto 1 2 4}
mkdir -p "$OUT"
cargo build --release -p silvic-bench
BENCH=target/release/silvic-bench
echo "# $(nproc) cores, $(uname -r), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)" \
  > "$OUT/machine.txt"

for mbit in 25000 100000; do
  for world in 4 8; do
    "$BENCH" --netns-hosts "$world" --link-mbit "$mbit" --link-limit --csv \
      > "$OUT/limit-w$world-$mbit.csv"
    for round in $(seq "$ROUNDS"); do
      for channels in $COUNTS; do
        "$BENCH" --netns-hosts "$world" --link-mbit "$mbit" --sizes 2M,16M,64M --cpu --json \
          --channels "$channels" > "$OUT/netns-w$world-$mbit-c$channels-r$round.json"
      done
    done
  done
done

for world in 4 8; do
  for round in $(seq "$ROUNDS"); do
    for channels in auto 1; do
      "$BENCH" --world "$world" --sizes 16M --cpu --json --channels "$channels" \
        > "$OUT/loopback-w$world-c$channels-r$round.json"
    done
    if python3 -c 'import torch' 2>/dev/null; then
      python3 "$PEERS/gloo_allreduce_bench.py" "$world" $((16 << 20)) \
        > "$OUT/gloo-w$world-r$round.csv"
    fi
  done
done
echo "results in $OUT (JSON lines where --cpu is measured: the CSV has no CPU column)"
