#!/usr/bin/env python3
"""Times ``lgb.train`` over silvic-net against LightGBM's own socket network: the same data,
parameters and world, runs interleaved, medians reported, on one bed or both: 4 rank processes
on 127.0.0.1 (``--bed loopback``, the default), or one rank on each of 4 network-namespace
hosts whose links are shaped to 1 Gbit/s (``--bed netns``, root only). Needs ``lightgbm`` and
the ``silvic_net`` wheel in the running Python.

    python scripts/bench-lightgbm.py --runs 3                 # loopback
    sudo .venv/bin/python scripts/bench-lightgbm.py --bed both --runs 3

Each run starts WORLD processes; each forms its network, builds its partition's Dataset (not
timed), then times ``lgb.train`` alone. A run's time is the slowest rank's. Every round of runs
goes through the beds in turn, each bed's two networks in alternating order. Prints one line per
run (with the ranks' context switches: voluntary ones are waits that slept, involuntary ones
preemptions), the load average, and a Markdown table of the medians.
"""

from __future__ import annotations

import argparse
import ctypes
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

    def switches() -> list[int]:
        """This process's voluntary and involuntary context switches so far."""
        with open("/proc/self/status") as f:
            return [int(line.split()[1]) for line in f if "ctxt_switches" in line]

    def train() -> dict[str, Any]:
        data = lgb.Dataset(x, y, params=p)
        data.construct()
        before = switches()
        started, cpu = time.perf_counter(), time.process_time()
        lgb.train(p, data, num_boost_round=args.rounds)
        return {
            "train_seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu,
            "switches": [b - a for a, b in zip(before, switches())],
        }

    # Both networks are formed before the Dataset, outside the timed part: LightGBM's own one
    # here as lgb.train would form it from `machines` (there its connecting, retries included,
    # would be timed), so that both build their Datasets over the network and start training
    # together.
    started = time.perf_counter()
    if args.rank == "silvic":
        import silvic_net.lightgbm
        from silvic_net import TcpCollective

        ring = TcpCollective.from_env(120.0)
        with silvic_net.lightgbm.network(ring):
            connect = time.perf_counter() - started
            measured = train()
    else:
        from lightgbm.basic import _LIB, _c_str, _safe_call

        minutes = 2  # LightGBM's listen timeout
        machines, port = os.environ["LGBM_MACHINES"], int(os.environ["LGBM_PORT"])
        _safe_call(
            _LIB.LGBM_NetworkInit(
                _c_str(machines), ctypes.c_int(port), ctypes.c_int(minutes), ctypes.c_int(world)
            )
        )
        try:
            connect = time.perf_counter() - started
            measured = train()
        finally:
            _safe_call(_LIB.LGBM_NetworkFree())
    print(json.dumps({**measured, "connect_seconds": connect}), flush=True)


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


class Bed:
    """Where the ranks run: 127.0.0.1, or one network-namespace host each on a bridge, every
    host's egress shaped with tc tbf (the bed `silvic-bench --netns-hosts N --link-mbit R`
    builds, crates/silvic-testbed/src/net.rs). The hosts are removed on exit."""

    def __init__(self, name: str, world: int, mbit: int) -> None:
        self.name, self.world, self.mbit = name, world, mbit
        self.spaces: list[str] = []
        self.runs = 0
        if name == "netns":
            self._build()

    def _build(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("--bed netns needs root (network namespaces)")
        # The testbed's prefix and this process's id: its sweep removes them if we die.
        base = f"svt-{os.getpid()}-lgb"
        switch = f"{base}-sw"

        def ip(*words: str) -> None:
            subprocess.run(["ip", *words], check=True)

        ip("netns", "add", switch)
        self.spaces.append(switch)
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        # A bucket of about 1 ms of traffic, at least 64 KiB; 20 ms of queue (as the testbed).
        burst = str(max(self.mbit * 1_000_000 // 8 // 1000, 64 * 1024))
        for h in range(self.world):
            ns = f"{base}-h{h}"
            ip("netns", "add", ns)
            self.spaces.append(ns)
            ip("-n", switch, "link", "add", f"p{h}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", switch, "link", "set", f"p{h}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                 "rate", f"{self.mbit}mbit", "burst", burst, "latency", "20ms"],
                check=True,
            )

    def close(self) -> None:
        for ns in reversed(self.spaces):
            subprocess.run(["ip", "netns", "del", ns], check=False)
        self.spaces = []

    def address(self, rank: int) -> str:
        return f"10.231.0.{rank + 1}" if self.name == "netns" else "127.0.0.1"

    def command(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.spaces[1 + rank]] if self.name == "netns" else []

    def interface(self) -> str:
        return "eth0" if self.name == "netns" else "lo"

    def ports(self) -> list[int]:
        """Ports for a run's ranks. A namespace host's ports are its own, but a port its last
        run listened on may still be in TIME_WAIT, so every run takes the next one."""
        self.runs += 1
        if self.name == "netns":
            return [12400 + self.runs] * self.world
        return free_ports(self.world)

    def title(self) -> str:
        if self.name == "netns":
            return f"{self.world} namespace hosts, {self.mbit} Mbit/s links (tc tbf)"
        return f"{self.world} processes on 127.0.0.1"


def run(
    args: argparse.Namespace, bed: Bed, network: str, meet: str
) -> tuple[float, list[int], float]:
    """One run: the slowest rank's time, the ranks' context switches summed, and the longest
    a rank took to form its network (not timed)."""
    ports = bed.ports()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SILVIC_")}
    env.update(
        WORLD_SIZE=str(args.world),
        SILVIC_RENDEZVOUS=f"file://{meet}",
        SILVIC_JOB_TOKEN="bench-token-3a9e1d7b42c85f0c",
        SILVIC_SOCKET_IFNAME=bed.interface(),
        LGBM_MACHINES=",".join(f"{bed.address(r)}:{p}" for r, p in enumerate(ports)),
    )
    argv = [sys.executable, __file__, "--rank", network] + [
        f"--{k}={getattr(args, k.replace('-', '_'))}"
        for k in ("rows", "features", "rounds", "leaves", "threads", "tree-learner")
    ]
    procs = [
        subprocess.Popen(
            bed.command(r) + argv,
            env={**env, "RANK": str(r), "LGBM_PORT": str(ports[r])},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(args.world)
    ]
    times, switches, connect = [], [0, 0], 0.0
    try:
        for p in procs:
            out, _ = p.communicate(timeout=args.limit)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if p.returncode != 0 or not lines:
                raise SystemExit(f"{network}: a rank failed:\n{out}")
            got = json.loads(lines[-1])
            times.append(got["train_seconds"])
            switches = [a + b for a, b in zip(switches, got["switches"])]
            connect = max(connect, got["connect_seconds"])
    finally:
        # LightGBM's own ranks wait a long time for a peer that failed: end them.
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return max(times), switches, connect


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
    parser.add_argument(
        "--bed", choices=["loopback", "netns", "both"], default="loopback",
        help="where the ranks run (netns: root only)",
    )
    parser.add_argument("--link-mbit", type=int, default=1000, help="netns link rate")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds a rank may take")
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    beds = ["loopback", "netns"] if args.bed == "both" else [args.bed]
    # Every bed is built first, so a missing privilege fails before any run.
    made = [Bed(name, args.world, args.link_mbit) for name in beds]
    results: dict[tuple[str, str], list[float]] = {
        (b.name, n): [] for b in made for n in ("silvic", "socket")
    }
    loads = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for bed in made:
                    order = ("silvic", "socket") if i % 2 == 0 else ("socket", "silvic")
                    for network in order:
                        meet = os.path.join(tmp, f"meet-{bed.name}-{i}-{network}")
                        seconds, (slept, preempted), connect = run(args, bed, network, meet)
                        results[(bed.name, network)].append(seconds)
                        loads.append(os.getloadavg()[0])
                        print(
                            f"run {i} {bed.name} {network}: {seconds:.3f} s "
                            f"(network formed in {connect:.2f} s, not timed; "
                            f"switches: {slept} voluntary, {preempted} involuntary; "
                            f"load average {loads[-1]:.1f})",
                            flush=True,
                        )
    finally:
        for bed in made:
            bed.close()
    print()
    print(f"load average (1 min) after each run: {min(loads):.1f} to {max(loads):.1f}")
    print()
    print(
        f"| bed | silvic-net, median of {args.runs} (s) | LightGBM socket, median (s) | ratio |"
        " silvic-net runs (s) | socket runs (s) |"
    )
    print("|---|---|---|---|---|---|")
    for bed in made:
        ours, theirs = (statistics.median(results[(bed.name, n)]) for n in ("silvic", "socket"))
        runs = [", ".join(f"{t:.2f}" for t in results[(bed.name, n)]) for n in ("silvic", "socket")]
        print(
            f"| {bed.title()} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.2f}x |"
            f" {runs[0]} | {runs[1]} |"
        )


if __name__ == "__main__":
    main()
