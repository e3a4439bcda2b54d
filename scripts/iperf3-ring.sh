#!/usr/bin/env bash
# What the links of a namespace bed carry in the ring's pattern, measured with iperf3: N hosts on
# a bridge (the bed `silvic-bench --netns-hosts N --link-mbit R` builds: veth, each host's egress
# shaped with tc tbf), and host i streaming to host i + 1, all at once. Prints each host's
# received rate and their mean; the ring's busbw at large sizes is compared with it.
#
#   sudo scripts/iperf3-ring.sh HOSTS MBIT [SECONDS]
#
# Needs root, ip, tc and iperf3. Everything it makes is removed on exit.
set -euo pipefail
hosts=${1:?hosts}; mbit=${2:?link rate in Mbit/s}; seconds=${3:-5}
base="svr-$$"; sw="$base-sw"; dir=$(mktemp -d)
cleanup() {
    for ns in $(ip netns list | awk '{print $1}' | grep "^$base-" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT
in_ns() { ip netns exec "$1" "${@:2}"; }

ip netns add "$sw"
in_ns "$sw" ip link add br0 type bridge
in_ns "$sw" ip link set br0 up
burst=$(( mbit * 1000000 / 8 / 1000 )); (( burst < 65536 )) && burst=65536
for ((h = 0; h < hosts; h++)); do
    ns="$base-h$h"
    ip netns add "$ns"
    in_ns "$sw" ip link add "p$h" type veth peer name eth0 netns "$ns"
    in_ns "$sw" ip link set "p$h" master br0 up
    in_ns "$ns" ip addr add "10.231.0.$((h + 1))/24" dev eth0
    in_ns "$ns" ip link set eth0 up
    in_ns "$ns" ip link set lo up
    in_ns "$ns" tc qdisc add dev eth0 root tbf rate "${mbit}mbit" burst "$burst" latency 20ms
    in_ns "$ns" iperf3 --server --one-off --daemon --logfile "$dir/server$h.log"
done
sleep 0.5
# Host h sends to host h + 1; the first second (slow start) is left out of the figure.
for ((h = 0; h < hosts; h++)); do
    to=$(( (h + 1) % hosts ))
    in_ns "$base-h$h" iperf3 --client "10.231.0.$((to + 1))" --time "$seconds" --omit 1 \
        --json > "$dir/client$h.json" &
done
wait
echo "# iperf3, $hosts namespace hosts, ${mbit} Mbit/s tbf, host i to host i + 1 all at once, $seconds s"
echo "# host  received (GB/s)"
for ((h = 0; h < hosts; h++)); do
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8e9)' \
        "$dir/client$h.json"
done | awk '{ printf "%6d  %.3f\n", NR - 1, $1; s += $1 } END { printf "# mean  %.3f GB/s per host\n", s / NR }'
