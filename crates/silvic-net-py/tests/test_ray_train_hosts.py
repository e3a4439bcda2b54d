"""The Ray Train tests again, on a Ray cluster of two hosts made of network namespaces.

The same network as the test bed's (crates/silvic-testbed/src/net.rs): one namespace per host,
each with its own address on a veth whose other end sits on a bridge in a switch namespace,
named ``svt-<pid>-...`` so that scripts/netns-sweep.sh removes what a killed run leaves. Every
address is on this machine's own namespaces, and nothing routes out of them. Host 0 runs the
Ray head, host 1 a second Ray node, 2 CPUs each, so the 4 workers of a trainer sit 2 and 2 on
two hosts and their ring crosses the bridge. The tests of test_ray_train.py then run as a pytest
of their own inside host 0, joining that cluster (``SILVIC_RAY_ADDRESS``, see conftest.py).

Needs root (network namespaces need CAP_NET_ADMIN) and ``ip``; skipped, saying so, without.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import pytest

pytest.importorskip("ray")

TESTS = os.path.dirname(os.path.abspath(__file__))
HEAD = "10.231.0.1"
PORT = 6379


def run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class Hosts:
    """Two host namespaces on a bridge, each running a Ray node; removed by :meth:`close`."""

    def __init__(self) -> None:
        base = f"svt-{os.getpid()}-ray"
        self.switch, self.hosts = f"{base}-sw", [f"{base}-h0", f"{base}-h1"]
        self.temp: list[str] = []
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in [TESTS, os.environ.get("PYTHONPATH")] if p),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            # CI sets 0 (a one-node cluster whose actors report 127.0.0.1); with 0, `ray start`
            # refuses to add a second node.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        }
        self.env.pop("SILVIC_RAY_ADDRESS", None)

    def build(self) -> None:
        run("ip", "netns", "add", self.switch)
        sw = ["ip", "-n", self.switch]
        run(*sw, "link", "add", "br0", "type", "bridge")
        run(*sw, "link", "set", "br0", "up")
        for h, ns in enumerate(self.hosts):
            run("ip", "netns", "add", ns)
            run(*sw, "link", "add", f"p{h}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            run(*sw, "link", "set", f"p{h}", "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"10.231.0.{h + 1}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")

    def start_ray(self) -> None:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        for h, ns in enumerate(self.hosts):
            temp = tempfile.mkdtemp(prefix=f"svrh{h}-")  # short: Ray's socket paths fit 107 bytes
            self.temp.append(temp)
            where = (
                ["--head", f"--port={PORT}", "--include-dashboard=false"]
                if h == 0
                else [f"--address={HEAD}:{PORT}"]
            )
            started = subprocess.run(
                ["ip", "netns", "exec", ns, ray, "start", *where,
                 f"--node-ip-address=10.231.0.{h + 1}", "--num-cpus=2",
                 "--object-store-memory=100000000", "--disable-usage-stats",
                 f"--temp-dir={temp}"],
                env=self.env, capture_output=True, text=True, timeout=120,
            )
            if started.returncode != 0:
                raise RuntimeError(f"ray start on host {h} failed: {started.stdout}{started.stderr}")

    def exec(self, h: int, *args: str, timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[h], *args],
            env=env, capture_output=True, text=True, timeout=timeout,
        )

    def close(self) -> None:
        # Every process of a host namespace is one this fixture started (a Ray node and its
        # workers): end them by id, then the namespaces and everything in them.
        for ns in self.hosts:
            try:
                pids = run("ip", "netns", "pids", ns).split()
            except RuntimeError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in [*self.hosts, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)
        for temp in self.temp:
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("not root: network namespaces need CAP_NET_ADMIN")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2) to build the namespace hosts")
    net = Hosts()
    try:
        net.build()
        net.start_ray()
        yield net
    finally:
        net.close()


@pytest.mark.timeout(420)
def test_ray_train_on_two_namespace_hosts(hosts: Hosts) -> None:
    started = time.monotonic()
    env = {**hosts.env, "SILVIC_RAY_ADDRESS": f"{HEAD}:{PORT}"}
    done = hosts.exec(
        0, sys.executable, "-m", "pytest", os.path.join(TESTS, "test_ray_train.py"),
        "-p", "no:cacheprovider", "-q", "-s", "-W", "ignore::DeprecationWarning",
        # The ring, a restart, the hang report, and LightGBM on Ray Train, across the two hosts.
        "-k", "four_workers_form or killed_worker or stops_calling or lightgbm_on_four_workers",
        timeout=400, env=env,
    )
    print(f"\n{done.stdout}\n{done.stderr}\n(on two hosts in {time.monotonic() - started:.0f} s)")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]
