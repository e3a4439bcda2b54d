"""The binding on its own: rings of threads in this process, on 127.0.0.1.

Every rank of a ring here is a thread of one Python process, so these tests also prove the GIL
is released while connecting and during collectives: otherwise the first rank to enter
``connect`` would hold it and the ring could never form.
"""

from __future__ import annotations

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np
import pytest

from silvic_net import (
    CollectiveError,
    ConnectError,
    PeerStats,
    RingListener,
    RingStats,
    TcpCollective,
)

T = TypeVar("T")
TIMEOUT = 10.0  # seconds; every ring below forms or fails well within it


def on_every_rank(world: int, fn: Callable[[int], T], limit: float = 30.0) -> list[T | BaseException]:
    """Runs fn(rank) on `world` threads at once; each result, or the exception it raised."""

    def run(rank: int) -> T | BaseException:
        try:
            return fn(rank)
        except BaseException as e:  # noqa: BLE001 - handed back to the test to inspect
            return e

    with ThreadPoolExecutor(max_workers=world) as pool:
        futures = [pool.submit(run, rank) for rank in range(world)]
        return [f.result(timeout=limit) for f in futures]


def form(
    world: int,
    tokens: list[str] | None = None,
    timeout: float = TIMEOUT,
    bind: Callable[[], RingListener] = lambda: TcpCollective.bind("127.0.0.1"),
) -> list[TcpCollective | BaseException]:
    listeners = [bind() for _ in range(world)]
    addresses = [listener.address() for listener in listeners]
    tokens = tokens or ["job-token"] * world
    return on_every_rank(
        world,
        lambda rank: TcpCollective.connect(
            listeners[rank], rank, addresses, tokens[rank], timeout=timeout
        ),
    )


def ring_of(
    world: int, bind: Callable[[], RingListener] = lambda: TcpCollective.bind("127.0.0.1")
) -> list[TcpCollective]:
    rings = form(world, bind=bind)
    for ring in rings:
        if isinstance(ring, BaseException):
            raise ring
    return rings  # type: ignore[return-value]


def test_world_of_one_returns_its_input_and_mirrors_the_rust_api() -> None:
    listener = TcpCollective.bind("127.0.0.1")
    assert isinstance(listener, RingListener)
    host, port = listener.address().rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    ring = TcpCollective.connect(listener, 0, [listener.address()], "token", timeout=5.0)
    assert (ring.rank, ring.world_size, ring.timeout) == (0, 1, 5.0)
    ring.set_timeout(2.5)
    assert ring.timeout == 2.5
    a = np.array([1.5, -2.0, np.nan])
    ring.allreduce_max_f64(a)
    np.testing.assert_array_equal(a, [1.5, -2.0, np.nan])
    b = np.array([7, -1], dtype=np.int64)
    ring.allreduce_sum_i64(b)
    assert b.tolist() == [7, -1]
    assert ring.allgather_bytes(b"record") == [b"record"]
    assert repr(ring) == "TcpCollective(rank=0, world_size=1)"
    stats = ring.stats()
    assert stats["collectives"] == 3 and stats["bytes_sent"] == 0, stats


def test_rings_of_threads_sum_gather_and_agree_bitwise() -> None:
    world = 3
    rings = ring_of(world)
    sizes = [0, 1, 2, 3, 4, 511, 512, 513, 4096, 100_003]

    def work(rank: int) -> list[bytes]:
        ring = rings[rank]
        assert (ring.rank, ring.world_size) == (rank, world)
        digests = []
        for i, n in enumerate(sizes):
            inputs = [np.random.default_rng([i, r]).standard_normal(n) for r in range(world)]
            exact = [np.floor(x * 1000) for x in inputs]  # integers: the sum is exact
            a = exact[rank].copy()
            ring.allreduce_sum_f64(a)
            np.testing.assert_array_equal(a, sum(exact))
            m = inputs[rank].copy()
            ring.allreduce_max_f64(m)
            np.testing.assert_array_equal(m, np.maximum.reduce(inputs) if n else m)
            s = inputs[rank].copy()
            ring.allreduce_sum_f64(s)  # not exact: every rank must still get the same bits
            np.testing.assert_allclose(s, sum(inputs), rtol=1e-12, atol=1e-12)
            digests.append(s.tobytes())
            big = np.full(n, 2**62 + rank, dtype=np.int64)
            ring.allreduce_sum_i64(big)  # wraps, as two's complement
            expected = (world * 2**62 + sum(range(world)) + 2**63) % 2**64 - 2**63
            assert big.tolist() == [expected] * n
            parts = ring.allgather_bytes(bytes([rank, i % 256]) * n)
            assert parts == [bytes([r, i % 256]) * n for r in range(world)]
        return digests

    results = on_every_rank(world, work)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize(
    ("bind", "prefix"),
    [
        (lambda: TcpCollective.bind_advertised("0.0.0.0", "127.0.0.1"), "127.0.0.1:"),
        (lambda: TcpCollective.bind("::1"), "[::1]:"),
    ],
    ids=["bind_advertised", "ipv6"],
)
def test_advertised_and_ipv6_listeners_form_rings(
    bind: Callable[[], RingListener], prefix: str
) -> None:
    try:
        probe = bind()
    except ConnectError as e:
        pytest.skip(f"this host cannot listen there: {e}")
    assert probe.address().startswith(prefix), probe.address()
    rings = ring_of(3, bind=bind)
    results = on_every_rank(3, lambda rank: rings[rank].allgather_bytes(b"%d" % rank))
    assert results == [[b"0", b"1", b"2"]] * 3


def test_peer_stats_count_each_stream_and_add_up_to_stats() -> None:
    # World 8: the two neighbours and the chord peers r +- 2, r + 4 (chords from 8 ranks).
    world = 8
    rings = ring_of(world)

    def work(rank: int) -> tuple[RingStats, list[PeerStats]]:
        a = np.ones(100_000)
        rings[rank].allreduce_sum_f64(a)
        assert a[0] == world
        rings[rank].allgather_bytes(b"xy")
        return rings[rank].stats(), rings[rank].peer_stats()

    with ThreadPoolExecutor(world) as pool:
        results = list(pool.map(work, range(world)))
    for rank, (stats, peers) in enumerate(results):
        assert [p["offset"] for p in peers[:2]] == [-1, 1], peers
        assert {(rank + p["offset"]) % world for p in peers} == {p["peer"] for p in peers}
        assert all(p["channel"] == 0 for p in peers), peers
        assert {p["peer"] for p in peers} == {(rank + d) % world for d in (-1, 1, -2, 2, 4)}
        assert sum(p["bytes_sent"] for p in peers) == stats["bytes_sent"]
        assert sum(p["bytes_received"] for p in peers) == stats["bytes_received"]
        assert all(p["waited"] >= 0.0 for p in peers)
        assert peers[0]["waited"] == stats["waited_left"]
        assert peers[1]["waited"] == stats["waited_right"]
    alone = ring_of(1)[0]
    assert alone.peer_stats() == []


def test_stats_count_collectives_bytes_and_waits() -> None:
    rings = ring_of(2)

    def work(rank: int) -> RingStats:
        a = np.ones(1000)
        rings[rank].allreduce_sum_f64(a)
        rings[rank].allgather_bytes(b"xy")
        return rings[rank].stats()

    with ThreadPoolExecutor(2) as pool:
        stats = list(pool.map(work, range(2)))
    for s in stats:
        assert set(s) == {
            "collectives", "bytes_sent", "bytes_received", "waited_left", "waited_right"
        }
        assert s["collectives"] == 2
        # 8000 bytes of buffer each way at least, plus headers.
        assert s["bytes_sent"] >= 8000 and s["bytes_received"] >= 8000, s
        assert s["waited_left"] >= 0.0 and s["waited_right"] >= 0.0


def test_max_propagates_nan_and_sums_keep_their_place() -> None:
    rings = ring_of(2)
    inputs = [np.array([1.0, np.nan, -np.inf, 3.0]), np.array([2.0, 0.0, -5.0, np.nan])]

    def work(rank: int) -> np.ndarray:
        view = np.zeros((2, 4))
        view[1] = inputs[rank]
        rings[rank].allreduce_max_f64(view[1])  # a contiguous row of a larger array, in place
        return view

    for view in on_every_rank(2, work):
        assert isinstance(view, np.ndarray)
        np.testing.assert_array_equal(view[0], 0.0)
        np.testing.assert_array_equal(view[1], [2.0, np.nan, -5.0, np.nan])


@pytest.mark.parametrize(
    ("method", "buf", "error", "words"),
    [
        ("allreduce_sum_f64", np.zeros(4, dtype=np.float32), TypeError, "dtype float64, got dtype float32"),
        ("allreduce_sum_f64", np.zeros(4, dtype=np.int64), TypeError, "dtype float64, got dtype int64"),
        ("allreduce_max_f64", [1.0, 2.0], TypeError, "numpy array of float64, got list"),
        ("allreduce_sum_i64", np.zeros(4), TypeError, "dtype int64, got dtype float64"),
        ("allreduce_sum_i64", np.zeros(4, dtype=np.int32), TypeError, "dtype int64, got dtype int32"),
        ("allreduce_sum_f64", np.zeros(4, dtype=">f8"), TypeError, "dtype float64, got dtype >f8"),
        ("allreduce_sum_f64", np.zeros((2, 2)), ValueError, "1-D array, got 2 dimensions"),
        ("allreduce_sum_f64", np.zeros(8)[::2], ValueError, "contiguous"),
        ("allreduce_sum_i64", np.zeros(8, dtype=np.int64)[::-1], ValueError, "contiguous"),
        ("allgather_bytes", "text", TypeError, "bytes"),
    ],
)
def test_bad_buffers_raise_before_anything_is_sent(
    method: str, buf: object, error: type[Exception], words: str
) -> None:
    rings = ring_of(2)
    with pytest.raises(error, match=words):
        getattr(rings[0], method)(buf)
    # Nothing went on the wire: the next collective is still in step on both ranks.
    results = on_every_rank(2, lambda rank: rings[rank].allgather_bytes(b"ok%d" % rank))
    assert results == [[b"ok0", b"ok1"]] * 2


def test_read_only_array_is_refused() -> None:
    ring = ring_of(1)[0]
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable") as refused:
        ring.allreduce_sum_f64(frozen)
    # The message says how to fix it, as Ray hands actors read-only arrays.
    assert "pass a copy, `array = array.copy()`" in str(refused.value), str(refused.value)


def test_length_mismatch_across_ranks_raises_collective_error_and_sticks() -> None:
    world = 3
    rings = ring_of(world)

    def work(rank: int) -> None:
        rings[rank].allreduce_sum_f64(np.ones(10 + (rank == 1)))

    errors = on_every_rank(world, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    kinds = {e.kind for e in errors}  # type: ignore[union-attr]
    assert "length_mismatch" in kinds and kinds <= {"length_mismatch", "aborted"}, kinds
    for rank, e in enumerate(errors):
        assert isinstance(e, CollectiveError)
        assert e.peer is not None and 0 <= e.peer < world
        # In the caller's units: the elements of its float64 arrays, not bytes.
        assert "float64 elements where" in str(e) and "bytes" not in str(e), str(e)
        if e.kind == "aborted":
            assert isinstance(e.origin_error, CollectiveError) and e.origin_error.kind == "length_mismatch"
            assert e.origin is not None and e.origin != rank
            assert str(e) == f"rank {e.origin} failed: {e.origin_error}", str(e)
        # The ring is closed: the same error again, at once, in the words it was raised with
        # (an allgather of bytes after a failed allreduce of float64 still counts float64).
        with pytest.raises(CollectiveError) as again:
            rings[rank].allgather_bytes(b"x")
        assert str(again.value) == str(e)


def test_a_length_mismatch_counts_the_callers_elements_and_names_both_ranks() -> None:
    # Rank 2 passes 1000 float32 where ranks 0 and 1 pass 1024: rank 2's neighbours see the
    # mismatch themselves, or hear of it from the other.
    world = 3
    rings = ring_of(world)

    def work(rank: int) -> None:
        rings[rank].allreduce(np.ones(1000 if rank == 2 else 1024, dtype=np.float32), "sum")

    errors = on_every_rank(world, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    for rank, e in enumerate(errors):
        assert isinstance(e, CollectiveError)
        mine, theirs = (1000, 1024) if rank == 2 else (1024, 1000)
        if e.kind == "length_mismatch":
            other = e.peer
            assert str(e) == (
                f"rank {other} passed {theirs if other == 2 or rank == 2 else mine} float32 "
                f"elements where this rank (rank {rank}) passed {mine}"
            ), str(e)
        else:
            assert e.kind == "aborted" and e.origin is not None and e.origin_error is not None
            origin = e.origin
            seen = e.origin_error
            assert seen.peer is not None
            mine_there = 1000 if origin == 2 else 1024
            theirs_there = 1000 if seen.peer == 2 else 1024
            assert str(seen) == (
                f"rank {seen.peer} passed {theirs_there} float32 elements where rank {origin} "
                f"passed {mine_there}"
            ), str(seen)
            assert str(e) == f"rank {origin} failed: {seen}"

    # Bytes are the unit of a call on bytes: its message counts bytes, as the crate's does.
    rings = ring_of(2)
    errors = on_every_rank(2, lambda rank: rings[rank].allgather_bytes(b"x" * (3 + rank)))
    for rank, e in enumerate(errors):
        assert isinstance(e, CollectiveError) and e.kind == "length_mismatch", e
        assert str(e) == f"rank {1 - rank} passed {4 - rank} bytes where this rank passed {3 + rank}"


def test_wrong_token_is_rejected_with_the_reason_and_never_shown() -> None:
    secret = "the-other-token"
    # The ranks told "rejected" fail at once; rank 0 keeps accepting (a stray connection must not
    # break a ring) until the rendezvous timeout, kept short here.
    results = form(3, tokens=["job-token", "job-token", secret], timeout=2.0)
    assert all(isinstance(r, ConnectError) for r in results), results
    rejected = [r for r in results if r.kind == "rejected"]  # type: ignore[union-attr]
    assert rejected, [str(r) for r in results]
    for error in rejected:
        assert isinstance(error, ConnectError)
        assert error.reason == "token_mismatch"
        assert "job token mismatch with rank" in str(error)
        assert error.peer in (0, 1, 2) and error.address and error.address.startswith("127.0.0.1:")
    for error in results:
        assert "job-token" not in str(error) and secret not in str(error)


def test_connect_argument_errors() -> None:
    with pytest.raises(ConnectError, match="cannot advertise 0.0.0.0") as unspecified:
        TcpCollective.bind("0.0.0.0")
    assert (unspecified.value.kind, unspecified.value.peer) == ("invalid_argument", None)
    with pytest.raises(ConnectError, match="not an IP address"):
        TcpCollective.bind_advertised("0.0.0.0", "not-an-ip")

    listener = TcpCollective.bind("127.0.0.1")
    with pytest.raises(ValueError, match="finite, non-negative"):
        TcpCollective.connect(listener, 0, [listener.address()], "t", timeout=float("nan"))
    with pytest.raises(ConnectError, match="rank 1 is out of range for 1 addresses"):
        TcpCollective.connect(listener, 1, [listener.address()], "t", timeout=1.0)
    # That connect consumed the listener, as the Rust function takes it by value.
    with pytest.raises(ConnectError, match="already given to connect") as reused:
        TcpCollective.connect(listener, 0, [listener.address()], "t", timeout=1.0)
    assert reused.value.kind == "invalid_argument"
    assert "used=True" in repr(listener)

    other = TcpCollective.bind("127.0.0.1")
    with pytest.raises(ConnectError, match="this listener.s address is not in the list"):
        TcpCollective.connect(other, 0, ["127.0.0.1:1"], "t", timeout=1.0)
    with pytest.raises(TypeError):
        TcpCollective.connect(TcpCollective.bind("127.0.0.1"), 0, "127.0.0.1:1", "t", 1.0)


def test_rendezvous_timeout_names_the_missing_peer() -> None:
    listener = TcpCollective.bind("127.0.0.1")
    absent = TcpCollective.bind("127.0.0.1")  # bound, so the port is real, but never connects
    addresses = [listener.address(), absent.address()]
    with pytest.raises(ConnectError) as timed_out:
        TcpCollective.connect(listener, 0, addresses, "t", timeout=0.5)
    assert timed_out.value.kind == "timeout"
    assert timed_out.value.peer == 1 and timed_out.value.address == absent.address()


def test_errors_pickle_with_their_attributes() -> None:
    rings = ring_of(2)
    errors = on_every_rank(2, lambda rank: rings[rank].allgather_bytes(b"x" * (rank + 1)))
    for e in errors:
        assert isinstance(e, CollectiveError)
        copy = pickle.loads(pickle.dumps(e))
        assert type(copy) is CollectiveError
        assert (str(copy), copy.kind, copy.peer, copy.origin) == (str(e), e.kind, e.peer, e.origin)



def test_a_ring_in_use_refuses_a_second_thread() -> None:
    rings = ring_of(2)
    started = threading.Event()
    result: list[object] = []

    def rank0_allreduce() -> None:
        started.set()
        buf = np.ones(8)
        rings[0].allreduce_sum_f64(buf)  # waits, GIL released, until rank 1 joins
        result.append(buf.tolist())

    thread = threading.Thread(target=rank0_allreduce)
    thread.start()
    started.wait(timeout=5)
    deadline = time.monotonic() + 5
    refused: RuntimeError | None = None
    while refused is None and time.monotonic() < deadline:
        try:
            rings[0].allgather_bytes(b"meanwhile")  # the other thread holds rank 0's ring
        except RuntimeError as e:
            refused = e
        else:
            pytest.fail("a second thread used a ring while a collective ran on it")
    assert refused is not None and "borrowed" in str(refused)
    rings[1].allreduce_sum_f64(np.ones(8))
    thread.join(timeout=10)
    assert result == [[2.0] * 8]


def test_a_watch_reads_progress_while_its_ring_is_blocked_in_a_collective() -> None:
    rings = ring_of(2)
    watches = [ring.watch() for ring in rings]  # taken on this thread, before any collective
    assert watches[0].progress() == {
        "entered": 0, "completed": 0, "index": None, "op": None, "in_call": None,
        "since_return": None, "failed": False,
    }
    done: list[float] = []

    def rank0_allreduce() -> None:
        buf = np.ones(8)
        rings[0].allreduce_sum_f64(buf)  # waits, GIL released, until rank 1 joins
        done.append(float(buf[0]))

    thread = threading.Thread(target=rank0_allreduce)
    thread.start()
    deadline = time.monotonic() + 10
    while watches[0].progress()["op"] is None:
        assert time.monotonic() < deadline, "rank 0 never entered its allreduce"
        time.sleep(0.01)
    # Rank 0's ring is borrowed by the blocked call; its watch still answers, from this thread.
    with pytest.raises(RuntimeError, match="borrowed"):
        rings[0].stats()
    during = watches[0].progress()
    assert (during["entered"], during["completed"], during["index"]) == (1, 0, 0)
    assert during["op"] == "allreduce_sum_f64" and during["in_call"] >= 0.0
    assert watches[1].progress()["entered"] == 0  # the rank rank 0 waits on: it is behind
    rings[1].allreduce_sum_f64(np.ones(8))
    thread.join(timeout=10)
    assert done == [2.0]
    after = watches[0].progress()
    assert (after["entered"], after["completed"], after["op"], after["failed"]) == (1, 1, None, False)
    assert after["since_return"] >= 0.0
    assert repr(watches[0]) == "RingWatch(entered=1, completed=1)"
