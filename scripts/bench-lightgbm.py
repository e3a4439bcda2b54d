#!/usr/bin/env python3
"""Times ``lgb.train`` over silvic-net against LightGBM's own socket network: the same data,
parameters and world (4 rank processes on 127.0.0.1 by default), runs interleaved, medians
reported. Needs ``lightgbm`` and the ``silvic_net`` wheel in the running Python.

    python scripts/bench-lightgbm.py --runs 3 --rows 50000 --features 50 --rounds 50

Each run starts WORLD processes; each forms its network, builds its partition's Dataset (not
timed), then times ``lgb.train`` alone. A run's time is the slowest rank's. Prints one line per
run and a Markdown table of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def params(args: argparse.Namespace, world: int) -> dict[str, Any]:
    return {
        "objective": "regression",
        "tree_learner": args.tree_learner,
        "num_machines": world,
        "pre_partition": True,
        "num_leaves": args.leaves,
        "num_threads": args.threads,
        "force_col_wise": True,
        "seed": 1,
        "verbose": -1,
    }


def rank_main(args: argparse.Namespace) -> None:
    import lightgbm as lgb
    import numpy as np

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(args.rows, args.features))
    y = x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] * x[:, 3] + rng.normal(scale=0.1, size=len(x))
    p = params(args, world)

    def train() -> float:
        data = lgb.Dataset(x, y, params=p)
        data.construct()
        started = time.perf_counter()
        lgb.train(p, data, num_boost_round=args.rounds)
        return time.perf_counter() - started

    if args.rank == "silvic":
        import silvic_net.lightgbm
        from silvic_net import TcpCollective

        ring = TcpCollective.from_env(120.0)
        with silvic_net.lightgbm.network(ring):
            seconds = train()
    else:
        p["machines"] = os.environ["LGBM_MACHINES"]
        p["local_listen_port"] = int(os.environ["LGBM_PORT"])
        seconds = train()
    print(json.dumps({"train_seconds": seconds}), flush=True)


def free_ports(n: int) -> list[int]:
    """Free ports below the ephemeral range (LightGBM's ranks dial from ephemeral ports)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports: list[int] = []
    for port in range(20000 + (os.getpid() * 11) % 5000, low):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise SystemExit(f"no {n} free ports below {low}")


def run(args: argparse.Namespace, network: str, meet: str) -> float:
    ports = free_ports(args.world)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SILVIC_")}
    env.update(
        WORLD_SIZE=str(args.world),
        SILVIC_RENDEZVOUS=f"file://{meet}",
        SILVIC_JOB_TOKEN="bench-token-3a9e1d7b42c85f0c",
        SILVIC_SOCKET_IFNAME="lo",
        LGBM_MACHINES=",".join(f"127.0.0.1:{p}" for p in ports),
    )
    argv = [sys.executable, __file__, "--rank", network] + [
        f"--{k}={getattr(args, k.replace('-', '_'))}"
        for k in ("rows", "features", "rounds", "leaves", "threads", "tree-learner")
    ]
    procs = [
        subprocess.Popen(
            argv,
            env={**env, "RANK": str(r), "LGBM_PORT": str(ports[r])},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(args.world)
    ]
    times = []
    for p in procs:
        out, _ = p.communicate(timeout=args.limit)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"{network}: a rank failed:\n{out}")
        times.append(json.loads(lines[-1])["train_seconds"])
    return max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", choices=["silvic", "socket"], help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per rank")
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--leaves", type=int, default=63)
    parser.add_argument("--threads", type=int, default=1, help="LightGBM threads per rank")
    parser.add_argument("--tree-learner", default="data")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds a rank may take")
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    results: dict[str, list[float]] = {"silvic": [], "socket": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for network in ("silvic", "socket") if i % 2 == 0 else ("socket", "silvic"):
                seconds = run(args, network, os.path.join(tmp, f"meet-{i}-{network}"))
                results[network].append(seconds)
                print(f"run {i} {network}: {seconds:.3f} s", flush=True)
    ours, theirs = (statistics.median(results[n]) for n in ("silvic", "socket"))
    print()
    print("| network | lgb.train, median of %d (s) | runs (s) |" % args.runs)
    print("|---|---|---|")
    for name, key, median in (("silvic-net", "silvic", ours), ("LightGBM socket", "socket", theirs)):
        runs = ", ".join(f"{t:.3f}" for t in results[key])
        print(f"| {name} | {median:.3f} | {runs} |")
    print(f"\nsilvic-net / LightGBM: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
