"""LightGBM's distributed training over silvic-net (``silvic_net.lightgbm.network``), with the
real LightGBM: 4 rank processes on 127.0.0.1, each with its own partition (``pre_partition``),
the ring formed by ``TcpCollective.from_env`` in a folder under pytest's ``tmp_path``, 20
boosting rounds. Every process has a timeout; a hang fails the test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

lgb = pytest.importorskip("lightgbm")

WORLD = 4
RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightgbm_rank.py")
LIMIT = 90.0  # seconds a rank process may take; a run here takes a few


def clean_env() -> dict[str, str]:
    skip = ("SILVIC_", "SLURM_", "OMPI_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        base.pop(k, None)
    return base


def free_ports(n: int) -> list[int]:
    """Free ports for LightGBM's own network (it needs them named), below the kernel's
    ephemeral range: its ranks dial each other from ephemeral ports, and a dial that takes a
    port another rank is about to listen on hangs the ring."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports: list[int] = []
    start = 10000 + (os.getpid() * 7) % max(1, low - 10000 - 1000)
    for port in range(start, low):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise AssertionError(f"no {n} free ports below {low}")


def run(
    tmp: Path,
    network: str,
    tree_learner: str = "data",
    quantized: bool = False,
    exit_rank: int = -1,
    exit_at: int = -1,
    odd: tuple[int, int] = (-1, 0),
    miscount_rank: int = -1,
) -> list[tuple[int, dict[str, Any]]]:
    """Runs one training on WORLD rank processes; each one's exit code and last JSON line."""
    meet = tmp / f"meet-{network}-{tree_learner}-{len(list(tmp.iterdir()))}"
    ports = free_ports(WORLD)
    machines = ",".join(f"127.0.0.1:{p}" for p in ports)
    common = {
        **clean_env(),
        "WORLD_SIZE": str(WORLD),
        "EXIT_RANK": str(exit_rank),
        "ODD_RANK": str(odd[0]),
        "ODD_LEAVES": str(odd[1]),
        "MISCOUNT_RANK": str(miscount_rank),
        "SILVIC_RENDEZVOUS": f"file://{meet}",
        "SILVIC_JOB_TOKEN": "lgbm-token-8c1f2e7d9a3b4c5d",
        "SILVIC_SOCKET_IFNAME": "lo",
        "LGBM_MACHINES": machines,
    }
    args = [network, tree_learner, "1" if quantized else "0", str(exit_at)]
    procs = [
        subprocess.Popen(
            [sys.executable, RANK_SCRIPT, *args],
            env={**common, "RANK": str(r), "LGBM_PORT": str(ports[r])},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    done = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=LIMIT)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert lines, f"rank {r} printed no result (exit {p.returncode}):\n{out}\n{err}"
            done.append((p.returncode, json.loads(lines[-1])))
    finally:
        for p in procs:
            p.kill()
    return done


def trees_of(done: list[tuple[int, dict[str, Any]]]) -> list[Any]:
    for r, (code, result) in enumerate(done):
        assert code == 0 and "trees" in result, f"rank {r}: {result}"
        assert result["rounds"] == 20
    return [result["trees"] for _, result in done]


def shared(trees: list[Any], tree_learner: str) -> list[Any]:
    """What every rank's trees must agree on. The voting learner keeps its root's
    ``internal_value`` from the rank's own rows (LightGBM's own network gives every rank
    another one too); every split, leaf and other statistic is global."""
    if tree_learner != "voting":
        return trees
    trimmed: list[Any] = json.loads(json.dumps(trees))
    for tree in trimmed:
        tree["tree_structure"].pop("internal_value", None)
    return trimmed


@pytest.mark.parametrize("tree_learner", ["data", "voting"])
def test_every_rank_trains_the_same_trees_and_two_runs_agree(
    tmp_path: Path, tree_learner: str
) -> None:
    first = trees_of(run(tmp_path, "silvic", tree_learner))
    assert len(first[0]) == 20
    agreed = shared(first[0], tree_learner)
    for r, trees in enumerate(first):
        assert shared(trees, tree_learner) == agreed, f"rank {r} trained other trees"
    second = trees_of(run(tmp_path, "silvic", tree_learner))
    assert second == first, "a second run trained other trees"


def test_feature_parallel_is_refused_by_lightgbms_c_api_on_every_rank(tmp_path: Path) -> None:
    # LightGBM's C API (so its Python package) does not run the feature-parallel learner at
    # all; the refusal reaches every rank as LightGBM's own error, and the ranks end cleanly.
    for r, (code, result) in enumerate(run(tmp_path, "silvic", "feature")):
        assert code == 0, f"rank {r}: {result}"
        assert "feature parallel" in result.get("error", ""), f"rank {r}: {result}"


def test_quantized_training_equals_lightgbms_own_network(tmp_path: Path) -> None:
    # Quantized gradients make the histograms integers: their sums are exact in any order, so
    # LightGBM's own network (another order of sums) must train the very same trees.
    ours = trees_of(run(tmp_path, "silvic", quantized=True))
    theirs = trees_of(run(tmp_path, "socket", quantized=True))
    assert all(trees == ours[0] for trees in ours)
    assert ours == theirs, "silvic-net and LightGBM's network trained different trees"


def test_a_rank_that_exits_fails_every_survivor_naming_it(tmp_path: Path) -> None:
    done = run(tmp_path, "silvic", exit_rank=2, exit_at=5)
    code, exited = done[2]
    assert code == 3 and "exited" in exited, exited
    for r in (0, 1, 3):
        code, result = done[r]
        assert code == 0, f"rank {r} did not live on: {result}"
        assert "error" in result, f"rank {r}: {result}"
        assert "rank 2" in result["error"], f"rank {r}: {result['error']}"
        assert result["error"].startswith("silvic-net: ")
        assert result["at"] - exited["exited"] < 15.0, f"rank {r} took too long"


def test_a_rank_whose_lightgbm_calls_differ_fails_every_rank_out_of_step(tmp_path: Path) -> None:
    # Rank 3 grows trees of 4 leaves, the others of 15: after its first tree its LightGBM calls
    # another collective than theirs. Every rank raises at that call instead of mixing data.
    done = run(tmp_path, "silvic", odd=(3, 4))
    errors = []
    for r, (code, result) in enumerate(done):
        assert code == 0 and "error" in result, f"rank {r}: {result}"
        errors.append(result["error"])
    assert "is out of step" in errors[3], errors[3]
    # Every other rank names rank 3, and the cause where it heard it. Rank 3's abort goes out
    # behind the last whole frame on each stream (best effort): a neighbour it is halfway
    # through writing a histogram to sees the stream end ("rank 3 closed the connection")
    # unless the abort travelling round the other way reaches it first.
    for r in (0, 1, 2):
        named = "rank 3 is out of step" in errors[r] or "rank 3 failed: " in errors[r]
        closed = "rank 3 closed the connection" in errors[r]
        assert named or closed, f"rank {r}: {errors[r]}"
        assert "out of step" in errors[r] or closed, f"rank {r}: {errors[r]}"


def test_a_rank_whose_lightgbm_counts_another_world_fails_every_rank_naming_it(
    tmp_path: Path,
) -> None:
    # Rank 1's LightGBM network is started for five machines on a ring of four: LightGBM hands
    # its hooks five blocks. That rank refuses before reading them; every rank's lgb.train
    # raises, the others naming rank 1, instead of waiting out the timeout for it.
    done = run(tmp_path, "silvic", miscount_rank=1)
    errors = []
    for r, (code, result) in enumerate(done):
        assert code == 0 and "error" in result, f"rank {r}: {result}"
        errors.append(result["error"])
    assert "LightGBM passed 5 blocks to a ring of 4 ranks" in errors[1], errors[1]
    for r in (0, 2, 3):
        assert "rank 1 failed: invalid argument: LightGBM passed 5 blocks" in errors[r], errors[r]
    finished = [result["at"] for _, result in done]
    assert max(finished) - min(finished) < 20.0, finished


def test_a_lent_ring_refuses_python_calls_until_the_block_ends() -> None:
    import numpy as np

    import silvic_net.lightgbm
    from silvic_net import TcpCollective

    listener = TcpCollective.bind("127.0.0.1")
    ring = TcpCollective.connect(listener, 0, [listener.address()], "token", timeout=5.0)
    with silvic_net.lightgbm.network(ring) as held:
        assert held is ring
        assert repr(ring) == "TcpCollective(lent to LightGBM)"
        with pytest.raises(RuntimeError, match="LightGBM's network"):
            ring.allreduce_sum_f64(np.zeros(2))
        with pytest.raises(RuntimeError, match="LightGBM's network"):
            _ = ring.rank
        with pytest.raises(RuntimeError, match="one silvic_net.lightgbm.network block"):
            with silvic_net.lightgbm.network(ring):
                pass
        # A world of one: LightGBM trains serially, and the block still holds the ring.
        data = lgb.Dataset(np.arange(40.0).reshape(20, 2), np.arange(20.0))
        lgb.train({"verbose": -1, "num_threads": 1}, data, num_boost_round=2)
    assert (ring.rank, ring.world_size) == (0, 1)
    assert ring.allgather_bytes(b"back") == [b"back"]
