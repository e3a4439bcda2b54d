#!/usr/bin/env bash
# Deletes test-bed network namespaces (svt-<pid>-...) whose creating process is gone: what a
# killed test run left behind. Everything the test bed makes (veths, the bridge, nft tables,
# qdiscs) lives inside those namespaces, so deleting them removes it all.
set -euo pipefail
command -v ip >/dev/null || exit 0
ip netns list 2>/dev/null | awk '{print $1}' | while read -r ns; do
  case "$ns" in
    svt-*)
      pid=${ns#svt-}; pid=${pid%%-*}
      if [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
        ip netns del "$ns" && echo "removed stale namespace $ns"
      fi ;;
  esac
done
