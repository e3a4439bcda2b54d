"""``bind_with`` and ``from_env``, the cluster entry points, from Python.

``bind_with`` rings are threads of this process on loopback; ``from_env`` ranks are processes
(each reads its own environment), meeting in a folder under pytest's ``tmp_path``. Every
process has a timeout; a hang fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from silvic_net import ConnectError, RingListener, TcpCollective

TIMEOUT = 10.0


def own_loopback(test: int) -> str:
    """A loopback address of this process alone, so the port numbers below are ours to count."""
    pid = os.getpid()
    return f"127.{(pid >> 8) & 0xFF}.{pid & 0xFF}.{test}"


def ring_sum(listeners: list[RingListener]) -> list[float]:
    addresses = [listener.address() for listener in listeners]

    def rank(r: int) -> float:
        ring = TcpCollective.connect(listeners[r], r, addresses, "t", TIMEOUT)
        buf = np.array([r + 1.0])
        ring.allreduce_sum_f64(buf)
        return float(buf[0])

    with ThreadPoolExecutor(max_workers=len(listeners)) as pool:
        return [f.result(timeout=30) for f in [pool.submit(rank, r) for r in range(len(listeners))]]


def test_bind_with_a_range_hands_out_its_first_free_ports_and_names_it_when_full() -> None:
    host = own_loopback(11)
    as_range = [TcpCollective.bind_with(host=host, ports=range(29500, 29502)) for _ in range(2)]
    assert [l.address() for l in as_range] == [f"{host}:29500", f"{host}:29501"]
    with pytest.raises(ConnectError, match=f"every port of 29500-29501 is taken on {host}") as full:
        TcpCollective.bind_with(host=host, ports=(29500, 29501))
    assert full.value.kind == "ports_taken"
    assert ring_sum(as_range) == [3.0, 3.0]
    # The ring has ended: the same fixed port is bound again at once.
    again = TcpCollective.bind_with(host=host, port=29500)
    assert again.address() == f"{host}:29500"


def test_bind_with_an_interface_and_advertise() -> None:
    assert TcpCollective.bind_with(interface="lo").address().startswith("127.0.0.1:")
    advertised = TcpCollective.bind_with(host="0.0.0.0", advertise="127.0.0.1")
    assert advertised.address().startswith("127.0.0.1:")
    with pytest.raises(ConnectError, match='no network interface "nosuch0".*lo') as missing:
        TcpCollective.bind_with(interface="nosuch0")
    assert missing.value.kind == "no_interface"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs host or interface"),
        ({"host": "127.0.0.1", "interface": "lo"}, "not both"),
        ({"host": "127.0.0.1", "port": 1, "ports": (1, 2)}, "port or ports, not both"),
    ],
)
def test_bind_with_argument_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConnectError, match=message) as refused:
        TcpCollective.bind_with(**kwargs)  # type: ignore[arg-type]
    assert refused.value.kind == "invalid_argument"


@pytest.mark.parametrize("ports", [range(10, 10), range(1, 9, 2), (1, 2, 3), "29500", (-1, 5)])
def test_bind_with_refuses_what_is_not_a_port_range(ports: object) -> None:
    with pytest.raises(ValueError, match="ports must be a range"):
        TcpCollective.bind_with(host="127.0.0.1", ports=ports)  # type: ignore[arg-type]


RANK = """
import sys
import numpy as np
from silvic_net import ConnectError, TcpCollective
try:
    ring = TcpCollective.from_env(20.0)
except ConnectError as e:
    print(f"{e.kind}: {e}")
    sys.exit(1)
buf = np.array([ring.rank + 1.0])
ring.allreduce_sum_f64(buf)
print(f"rank {ring.rank} of {ring.world_size}: {buf[0]}")
"""


def run_ranks(envs: list[dict[str, str]]) -> list[subprocess.CompletedProcess[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SILVIC_", "SLURM_", "OMPI_"))}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        base.pop(k, None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK],
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in envs
    ]
    done = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=60)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, None))
    finally:
        for p in procs:
            p.kill()
    return done


def test_from_env_forms_a_ring_of_processes_through_a_folder(tmp_path: Path) -> None:
    common = {
        "SILVIC_RENDEZVOUS": f"file://{tmp_path / 'meet'}",
        "SILVIC_JOB_TOKEN": "py-token-5f0c3a9e1d7b42c8",
        "SILVIC_SOCKET_IFNAME": "lo",
    }
    # torchrun's variable names.
    done = run_ranks([{**common, "RANK": str(r), "WORLD_SIZE": "3"} for r in range(3)])
    for r, d in enumerate(done):
        assert d.returncode == 0, d.stdout
        assert d.stdout.strip() == f"rank {r} of 3: 6.0"


def test_from_env_names_the_variable_at_fault() -> None:
    done = run_ranks([{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SILVIC_RENDEZVOUS": "tcp://127.0.0.1:9"}])
    assert done[0].returncode == 1
    assert done[0].stdout.strip() == (
        "environment: SILVIC_JOB_TOKEN: missing: every rank of a job needs the same secret job token"
    )
