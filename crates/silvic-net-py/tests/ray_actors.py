"""Actor classes for test_ray.py, in a module of their own so Ray workers import them by name."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np
import ray

from silvic_net import CollectiveError, TcpCollective
from silvic_net.ray import RingMember


def inputs(seed: int, i: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """What `rank` contributes to collective `i`: exact f64, raw f64, int64 and bytes."""
    rng = np.random.default_rng([seed, i, rank])
    raw = rng.standard_normal(n) * 1e3
    exact = np.floor(raw)  # integer-valued: sums are exact in any order
    ints = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    record = bytes(rng.integers(0, 256, size=n % 97, dtype=np.uint8))
    return exact, raw, ints, record


def describe(error: CollectiveError) -> dict[str, Any]:
    cause = error.origin_error
    return {
        "kind": error.kind,
        "peer": error.peer,
        "origin": error.origin,
        "cause_kind": cause.kind if cause is not None else None,
        "message": str(error),
        "at": time.time(),
    }


def mixed(ring: TcpCollective, seed: int, iterations: int) -> dict[str, Any]:
    """`iterations` rounds of the four collectives over many lengths, every result checked
    against what every rank contributed (each rank can compute all of them)."""
    rank, world = ring.rank, ring.world_size
    lengths = [0, 1, 3, 4, 5, 7, 64, 511, 512, 513, 4096, 20_011, 100_003]
    checked = 0
    digest = hashlib.sha256()
    for i in range(iterations):
        n = lengths[i % len(lengths)]
        every = [inputs(seed, i, r, n) for r in range(world)]
        op = i % 4
        if op == 0:
            buf = every[rank][0].copy()
            ring.allreduce_sum_f64(buf)
            np.testing.assert_array_equal(buf, np.sum([e[0] for e in every], axis=0))
        elif op == 1:
            buf = every[rank][1].copy()
            ring.allreduce_max_f64(buf)
            np.testing.assert_array_equal(buf, np.max([e[1] for e in every], axis=0))
            buf2 = every[rank][1].copy()
            ring.allreduce_sum_f64(buf2)  # inexact: the bits must match on every rank
            np.testing.assert_allclose(buf2, np.sum([e[1] for e in every], axis=0), rtol=1e-9)
            digest.update(buf2.tobytes())
            checked += 1
        elif op == 2:
            buf = every[rank][2].copy()
            ring.allreduce_sum_i64(buf)
            expected = np.zeros(n, dtype=np.int64)
            for e in every:
                expected += e[2]  # numpy int64 arithmetic wraps, as the ring's sum does
            np.testing.assert_array_equal(buf, expected)
        else:
            parts = ring.allgather_bytes(every[rank][3])
            assert parts == [e[3] for e in every]
        checked += 1
    return {"rank": rank, "checked": checked, "digest": digest.hexdigest()}


@ray.remote(num_cpus=1)
class Worker(RingMember):
    """A ring member with the test's workloads."""

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> tuple[int, int, float]:
        return self.ring.rank, self.ring.world_size, self.ring.timeout

    def set_timeout(self, seconds: float) -> None:
        self.ring.set_timeout(seconds)

    def allgather(self, local: bytes) -> list[bytes]:
        return self.ring.allgather_bytes(local)

    def mixed(self, seed: int, iterations: int) -> dict[str, Any]:
        return mixed(self.ring, seed, iterations)

    def allreduce_until_error(self, n: int, seconds: float) -> dict[str, Any]:
        """Large allreduces back to back until one fails (or `seconds` pass); what happened."""
        ring = self.ring
        buf = np.empty(n)
        done = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            buf.fill(1.0)
            try:
                ring.allreduce_sum_f64(buf)
            except CollectiveError as e:
                return {"rank": ring.rank, "done": done, **describe(e)}
            assert buf[0] == buf[-1] == ring.world_size
            done += 1
        return {"rank": ring.rank, "done": done, "kind": None}

    def call_again(self) -> dict[str, Any]:
        """One more collective on this actor's ring, which has failed: the same error, at once."""
        started = time.monotonic()
        try:
            self.ring.allgather_bytes(b"again")
        except CollectiveError as e:
            return {**describe(e), "seconds": time.monotonic() - started}
        return {"kind": None}
