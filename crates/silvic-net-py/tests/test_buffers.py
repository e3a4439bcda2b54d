"""An array is read-only to Python while a collective runs on it, and writeable again after,
on every path out of the call."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import numpy.typing as npt
import pytest

from silvic_net import CollectiveError, TcpCollective
from test_binding import ring_of

Reduce = Callable[[TcpCollective, npt.NDArray[np.generic]], None]
OPS: list[tuple[str, type[np.generic]]] = [
    ("allreduce_sum_f64", np.float64),
    ("allreduce_sum_i64", np.int64),
    ("allreduce_max_f64", np.float64),
]


def wait_until(condition: Callable[[], bool], limit: float, what: str) -> None:
    """A bounded poll: fails the test if `condition` is not met within `limit` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {limit} s"
        time.sleep(0.001)


@pytest.mark.parametrize("op,dtype", OPS)
def test_an_array_is_read_only_while_a_collective_runs_on_it(
    op: str, dtype: type[np.generic]
) -> None:
    rings = ring_of(2)
    a = np.arange(1000).astype(dtype)  # 8000 bytes: the ring path
    b = np.arange(1000).astype(dtype)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Rank 1 has not called yet, so rank 0 waits on it with the array in use.
        running = pool.submit(getattr(rings[0], op), a)
        wait_until(lambda: not a.flags.writeable, 10.0, "the array was made read-only")
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 99
        getattr(rings[1], op)(b)
        running.result(timeout=30)
    assert a.flags.writeable and b.flags.writeable
    expected = 2 * np.arange(1000) if "sum" in op else np.arange(1000)
    np.testing.assert_array_equal(a, expected.astype(dtype))
    np.testing.assert_array_equal(b, expected.astype(dtype))
    a[0] = 1  # writeable again, for real


@pytest.mark.parametrize("op,dtype", OPS)
def test_the_array_is_writeable_again_after_a_collective_fails(
    op: str, dtype: type[np.generic]
) -> None:
    rings = ring_of(2)
    rings[0].set_timeout(0.2)
    a = np.ones(10, dtype=dtype)
    with pytest.raises(CollectiveError) as failure:
        getattr(rings[0], op)(a)  # rank 1 never calls: rank 0 times out
    assert failure.value.kind == "timeout"
    assert a.flags.writeable
    a[0] = 5


def test_a_read_only_array_is_refused_and_stays_read_only() -> None:
    listener = TcpCollective.bind("127.0.0.1")
    ring = TcpCollective.connect(listener, 0, [listener.address()], "a" * 32, timeout=5.0)
    a = np.ones(4)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        ring.allreduce_sum_f64(a)
    assert not a.flags.writeable
    # And a world of one, which returns its input, hands a writeable array back writeable.
    b = np.ones(4)
    ring.allreduce_sum_f64(b)
    assert b.flags.writeable


@pytest.mark.parametrize("op,dtype", OPS)
def test_an_array_resized_during_a_call_fails_the_call_on_every_rank(
    op: str, dtype: type[np.generic]
) -> None:
    # Numpy lets another thread free an array's memory (resize with refcheck=False) while a
    # collective runs on it, read-only flag or not: the ring must never write into it. The
    # call that lost its array raises, and the ring closes, so every rank's next call raises
    # too instead of going on with a result this rank does not have.
    rings = ring_of(2)
    a = np.arange(1000).astype(dtype)  # 8000 bytes: the ring path
    b = np.arange(1000).astype(dtype)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Rank 1 has not called yet, so rank 0 waits on it with the array in use.
        running = pool.submit(getattr(rings[0], op), a)
        wait_until(lambda: not a.flags.writeable, 10.0, "the array was made read-only")
        a.resize(200_000, refcheck=False)  # its old memory is freed
        getattr(rings[1], op)(b)
        with pytest.raises(CollectiveError, match="resized or replaced while") as lost:
            running.result(timeout=30)
    assert lost.value.kind == "invalid_argument"
    with pytest.raises(CollectiveError) as told:
        getattr(rings[1], op)(np.arange(10).astype(dtype))
    assert told.value.peer == 0 and "resized or replaced" in str(told.value), told.value


def test_writes_through_another_view_during_a_call_never_reach_the_ring() -> None:
    # Another view of the array stays writeable while the call runs; what is written through
    # it never mixes into the sum, which every rank gets whole (the result overwrites it).
    rings = ring_of(2)
    a = np.arange(100_000, dtype=np.float64)  # 800 KB: many slices on the ring path
    view = a[:]
    b = np.arange(100_000, dtype=np.float64)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(rings[0].allreduce_sum_f64, a)
        wait_until(lambda: not a.flags.writeable, 10.0, "the array was made read-only")
        view[:] = -1.0  # the view is still writeable
        rings[1].allreduce_sum_f64(b)
        running.result(timeout=30)
    expected = 2 * np.arange(100_000, dtype=np.float64)
    np.testing.assert_array_equal(b, expected)
    np.testing.assert_array_equal(a, expected)
