"""The allreduce path from Python: ``connect`` and ``from_env`` take ``allreduce="auto"``, the
same on every rank or every rank's connect fails naming the ranks that differ, and
``SILVIC_ALLREDUCE`` is read at connect. Real rings of threads on loopback, each bounded by
``on_every_rank``'s limit and the connect timeout."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from silvic_net import AllreducePathName, ConnectError, ConnectErrorKind, TcpCollective
from test_binding import on_every_rank

TOKEN = "py-allreduce-path-token-4e0b9a7c"  # long enough not to warn
TIMEOUT = 20.0


@pytest.fixture(autouse=True)
def no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests say what SILVIC_ALLREDUCE is; the caller's environment does not."""
    monkeypatch.delenv("SILVIC_ALLREDUCE", raising=False)


def connect_all(paths: list[str]) -> list[TcpCollective | BaseException]:
    """A ring of ``len(paths)`` ranks, rank ``r`` connecting with ``allreduce=paths[r]``."""
    listeners = [TcpCollective.bind("127.0.0.1") for _ in paths]
    addresses = [listener.address() for listener in listeners]
    return on_every_rank(
        len(paths),
        lambda rank: TcpCollective.connect(
            listeners[rank], rank, addresses, TOKEN, TIMEOUT, allreduce=paths[rank]  # type: ignore[arg-type]
        ),
    )


def test_the_paths_are_the_ones_the_rust_crate_names() -> None:
    assert get_args(AllreducePathName) == ("auto", "ring", "gather", "bruck", "index")
    assert "disagreement" in get_args(ConnectErrorKind)


def test_a_rank_on_another_path_fails_every_ranks_connect_naming_it() -> None:
    results = connect_all(["auto", "auto", "index", "auto"])
    for rank, result in enumerate(results):
        assert isinstance(result, ConnectError), f"rank {rank}: {result!r}"
        assert (result.kind, result.peer, result.address) == ("disagreement", 2, None), result
        assert "index on rank 2, against auto on ranks 0, 1, 3" in str(result), result


def sent_by_a_sum(path: str, world: int, length: int) -> list[int]:
    """Every rank sums ``length`` float64 once on ``path``; checks the sum, returns the bytes
    each rank sent."""
    rings = connect_all([path] * world)

    def work(rank: int) -> int:
        ring = rings[rank]
        assert isinstance(ring, TcpCollective), ring
        values = np.arange(length, dtype=np.float64) * (rank + 1)
        ring.allreduce_sum_f64(values)
        expected = np.arange(length, dtype=np.float64) * sum(range(1, world + 1))
        np.testing.assert_array_equal(values, expected)
        return int(ring.stats()["bytes_sent"])

    sent = on_every_rank(world, work)
    for outcome in sent:
        if isinstance(outcome, BaseException):
            raise outcome
    return sent  # type: ignore[return-value]


def test_a_forced_path_is_the_one_the_sums_take() -> None:
    # 16 KiB at world 4: the ring sends 2(n-1)/n of it per rank, the gather n - 1 times it.
    payload = 16 * 1024
    for sent in sent_by_a_sum("ring", 4, payload // 8):
        assert payload * 3 // 2 <= sent < payload * 2, sent
    for sent in sent_by_a_sum("gather", 4, payload // 8):
        assert payload * 3 <= sent < payload * 7 // 2, sent


def test_a_bad_path_names_the_argument_and_leaves_the_listener_unused() -> None:
    listener = TcpCollective.bind("127.0.0.1")
    addresses = [listener.address()]
    with pytest.raises(ConnectError) as raised:
        TcpCollective.connect(listener, 0, addresses, TOKEN, 5.0, allreduce="rings")  # type: ignore[arg-type]
    assert raised.value.kind == "invalid_argument"
    assert 'allreduce must be one of auto, ring, gather, bruck, index, got "rings"' in str(
        raised.value
    )
    ring = TcpCollective.connect(listener, 0, addresses, TOKEN, 5.0, allreduce="bruck")
    assert ring.world_size == 1
    with pytest.raises(ConnectError) as raised:
        TcpCollective.from_env(5.0, allreduce="Ring")  # type: ignore[arg-type]
    assert raised.value.kind == "invalid_argument" and '"Ring"' in str(raised.value)


def test_connect_and_from_env_read_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SILVIC_ALLREDUCE", "bogus")
    listener = TcpCollective.bind("127.0.0.1")
    with pytest.raises(ConnectError) as raised:
        TcpCollective.connect(listener, 0, [listener.address()], TOKEN, 5.0)
    assert raised.value.kind == "environment"
    assert str(raised.value).startswith('SILVIC_ALLREDUCE: "bogus" is not an allreduce path')
    for name in ("SILVIC_RANK", "SILVIC_WORLD_SIZE", "SILVIC_JOB_TOKEN"):
        monkeypatch.setenv(name, {"SILVIC_RANK": "0", "SILVIC_WORLD_SIZE": "1"}.get(name, TOKEN))
    with pytest.raises(ConnectError) as raised:
        TcpCollective.from_env(5.0)
    assert raised.value.kind == "environment" and "SILVIC_ALLREDUCE" in str(raised.value)
    # "auto" leaves the path to the variable, a forced argument wins over it: rank 0 takes the
    # ring from the variable, rank 1 the gather from its argument, and both are told so.
    monkeypatch.setenv("SILVIC_ALLREDUCE", "ring")
    for rank, result in enumerate(connect_all(["auto", "gather"])):
        assert isinstance(result, ConnectError) and result.kind == "disagreement", result
        assert "gather on rank 1, against ring on rank 0" in str(result), f"rank {rank}: {result}"
