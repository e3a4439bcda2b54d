"""The trainers' op set from Python: typed allreduces of numpy arrays, the record reduce-scatter
and allreduce with a Python fold, the variable-length allgather and the broadcast, on rings of
threads in this process (so the GIL is released during each call and taken back only for a
fold)."""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt
import pytest

from silvic_net import CollectiveError, TcpCollective
from test_binding import on_every_rank, ring_of

DTYPES: list[type[np.generic]] = [np.float32, np.float64, np.int32, np.int64, np.uint64]


def values(rank: int, n: int, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
    base = (np.arange(n) * 7 + rank * 13) % 17
    return np.asarray(base + 100 * rank, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_a_typed_allreduce_gives_every_rank_the_same_reduction(
    dtype: type[np.generic], op: str
) -> None:
    world, n = 3, 2000  # 8 KiB of int32/float32: past the 4 KiB cut
    rings = ring_of(world)
    arrays = [values(rank, n, dtype) for rank in range(world)]
    inputs = [a.copy() for a in arrays]
    results = on_every_rank(world, lambda rank: rings[rank].allreduce(arrays[rank], op))  # type: ignore[arg-type]
    assert results == [None] * world
    stacked = np.stack(inputs)
    expected = {"sum": stacked.sum(axis=0), "min": stacked.min(axis=0), "max": stacked.max(axis=0)}[op]
    for a in arrays:
        assert a.dtype == dtype
        # Small integers: every order of the float sums is exact, so numpy's sum is the oracle.
        np.testing.assert_array_equal(a, expected.astype(dtype))
        assert a.tobytes() == arrays[0].tobytes()


def test_a_bad_array_or_op_is_refused_before_anything_is_sent() -> None:
    (ring,) = ring_of(1)
    with pytest.raises(TypeError, match="uint64"):
        ring.allreduce(np.zeros(3, dtype=np.int16), "sum")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="numpy array"):
        ring.allreduce([1.0, 2.0], "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"sum", "min" or "max"'):
        ring.allreduce(np.zeros(3, dtype=np.float32), "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="writeable"):
        frozen = np.zeros(3, dtype=np.uint64)
        frozen.flags.writeable = False
        ring.allreduce(frozen, "max")
    assert ring.stats()["collectives"] == 0


def fold(acc: bytes, nxt: bytes) -> bytes:
    """8-byte records, ``3 * acc + next`` modulo 2**64: the result shows the order."""
    n = len(acc) // 8
    a = struct.unpack(f"<{n}Q", acc)
    b = struct.unpack(f"<{n}Q", nxt)
    return struct.pack(f"<{n}Q", *(((3 * x + y) % 2**64) for x, y in zip(a, b)))


def record(rank: int, k: int) -> int:
    return (rank + 1) * 1000 + k


def records(rank: int, n: int) -> bytes:
    return b"".join(struct.pack("<Q", record(rank, k)) for k in range(n))


def folded(world: int, block: int, k: int) -> int:
    acc = record((block + 1) % world, k)
    for step in range(2, world + 1):
        acc = (3 * acc + record((block + step) % world, k)) % 2**64
    return acc


def test_reduce_scatter_and_allreduce_of_records_fold_in_the_documented_order() -> None:
    world = 4
    rings = ring_of(world)
    layout = [3, 0, 1, 700]  # records per block: unequal, one empty, one single
    total = sum(layout)

    def call(rank: int) -> tuple[bytes, bytes]:
        mine = rings[rank].reduce_scatter_records(
            records(rank, total), [n * 8 for n in layout], 8, fold
        )
        return mine, rings[rank].allreduce_records(records(rank, 9), 8, fold)

    results = on_every_rank(world, call)
    for rank, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        mine, everything = result
        start = sum(layout[:rank])
        want = b"".join(
            struct.pack("<Q", folded(world, rank, start + k)) for k in range(layout[rank])
        )
        assert mine == want, f"rank {rank}"
        # 9 records in 4 segments of 3, 2, 2, 2.
        segments = [0, 0, 0, 1, 1, 2, 2, 3, 3]
        want = b"".join(struct.pack("<Q", folded(world, segments[k], k)) for k in range(9))
        assert everything == want, f"rank {rank}"


def test_a_fold_that_raises_is_raised_once_the_ring_is_through() -> None:
    world = 2
    rings = ring_of(world)

    def broken(acc: bytes, nxt: bytes) -> bytes:
        raise KeyError("the fold's own error")

    def call(rank: int) -> object:
        return rings[rank].allreduce_records(records(rank, 4), 8, broken)

    results = on_every_rank(world, call)
    assert all(isinstance(r, KeyError) for r in results), results
    # The ring is still in step: the next call works on every rank.
    gathered = on_every_rank(world, lambda rank: rings[rank].allgather_bytes(b"ok"))
    assert gathered == [[b"ok", b"ok"]] * world


def test_varlen_allgather_and_broadcast_deliver_any_length() -> None:
    world = 3
    rings = ring_of(world)

    def call(rank: int) -> tuple[list[bytes], bytes, bytes]:
        gathered = rings[rank].allgather_varlen(bytes([rank]) * (rank * 5000))
        blocks = rings[rank].allgather_blocks(bytes([rank + 1]) * rank, [0, 1, 2])
        return gathered, rings[rank].broadcast_bytes(b"model" if rank == 2 else b"", 2), blocks

    for result in on_every_rank(world, call):
        assert not isinstance(result, BaseException), result
        gathered, model, blocks = result
        assert gathered == [bytes([r]) * (r * 5000) for r in range(world)]
        assert model == b"model"
        assert blocks == b"\x02\x03\x03"
    (alone,) = ring_of(1)
    with pytest.raises(ValueError, match="one block length per rank"):
        alone.allgather_blocks(b"", [0, 0])
    with pytest.raises(ValueError, match="block is 2 bytes, local is 1"):
        alone.allgather_blocks(b"x", [2])


def test_ranks_calling_different_ops_raise_out_of_step() -> None:
    world = 2
    rings = ring_of(world)
    rings[0].set_timeout(20.0)

    def call(rank: int) -> object:
        if rank == 0:
            return rings[0].broadcast_bytes(b"x", 0)
        return rings[1].allgather_varlen(b"x")

    results = on_every_rank(world, call)
    for rank, result in enumerate(results):
        assert isinstance(result, CollectiveError), result
        kind = result.origin_error.kind if result.kind == "aborted" else result.kind  # type: ignore[union-attr]
        assert kind == "out_of_step", f"rank {rank}: {result}"
        assert result.peer == 1 - rank


def test_a_root_outside_the_world_fails_every_rank_naming_the_origin() -> None:
    world = 3
    rings: list[TcpCollective] = ring_of(world)
    results = on_every_rank(world, lambda rank: rings[rank].broadcast_bytes(b"", 5 if rank == 1 else 0))
    assert isinstance(results[1], CollectiveError) and results[1].kind == "invalid_argument"
    for rank in (0, 2):
        error = results[rank]
        assert isinstance(error, CollectiveError), error
        assert (error.kind, error.origin) == ("aborted", 1), f"rank {rank}: {error}"
