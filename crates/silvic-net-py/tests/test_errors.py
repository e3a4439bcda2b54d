"""The errors' shape from Python: one base class, the kinds and reasons the stubs list, and
``address`` holding a network address or nothing (never a path or a sentence).

Each error here is a real one, from the binding (a refused token, a rendezvous nobody joins, a
folder already claimed), so a kind the Rust crate renames or adds fails ``test_kinds_...``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import get_args

import pytest

from silvic_net import (
    CollectiveError,
    CollectiveErrorKind,
    ConnectError,
    ConnectErrorKind,
    RejectReasonName,
    RingStats,
    SilvicError,
    TcpCollective,
)
from test_binding import form, on_every_rank, ring_of

TOKEN = "py-errors-token-7c1d9e04b3a25f86"  # long enough not to warn


def test_every_error_of_the_library_is_a_silvic_error() -> None:
    assert issubclass(CollectiveError, SilvicError) and issubclass(ConnectError, SilvicError)
    assert SilvicError.__module__ == "silvic_net" and issubclass(SilvicError, Exception)
    with pytest.raises(SilvicError) as refused:
        TcpCollective.bind("0.0.0.0")
    assert type(refused.value) is ConnectError
    rings = ring_of(2)
    failed = on_every_rank(2, lambda rank: rings[rank].allgather_bytes(b"x" * (rank + 1)))
    for e in failed:
        assert isinstance(e, SilvicError) and type(e) is CollectiveError, e
        assert e.kind in get_args(CollectiveErrorKind), e.kind


def test_a_rejection_gives_a_kind_and_a_reason_the_stubs_list() -> None:
    results = form(2, tokens=[TOKEN, TOKEN + "-other"], timeout=5.0)
    rejected = [e for e in results if isinstance(e, ConnectError) and e.kind == "rejected"]
    assert rejected, results
    for e in rejected:
        assert e.kind in get_args(ConnectErrorKind)
        assert e.reason == "token_mismatch" and e.reason in get_args(RejectReasonName)
        assert e.address is not None and e.address.startswith("127.0.0.1:"), e.address
        assert e.path is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def from_env_alone(monkeypatch: pytest.MonkeyPatch, rendezvous: str) -> ConnectError:
    """Rank 0 of 2 calling from_env for half a second, with no rank 1: the error it raises."""
    for name in list(os.environ):
        if name.startswith(("SILVIC_", "SLURM_", "OMPI_")) or name in (
            "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX"
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SILVIC_RANK", "0")
    monkeypatch.setenv("SILVIC_WORLD_SIZE", "2")
    monkeypatch.setenv("SILVIC_JOB_TOKEN", TOKEN)
    monkeypatch.setenv("SILVIC_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("SILVIC_RENDEZVOUS", rendezvous)
    with pytest.raises(ConnectError) as raised:
        TcpCollective.from_env(0.5)
    return raised.value


@pytest.mark.parametrize("scheme", ["tcp", "file"])
def test_a_rendezvous_nobody_joins_times_out_naming_the_rank_and_no_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str
) -> None:
    rendezvous = f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp" else f"file://{tmp_path}"
    e = from_env_alone(monkeypatch, rendezvous)
    assert (e.kind, e.peer, e.address, e.path, e.reason) == ("timeout", 1, None, None, None), e
    assert "ranks [1] never gave their addresses" in str(e), e


def test_a_folder_error_names_its_path_not_an_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "rank-0").write_text("left by an earlier run\n")
    e = from_env_alone(monkeypatch, f"file://{tmp_path}")
    assert (e.kind, e.address, e.path) == ("folder", None, str(tmp_path / "rank-0")), e


def test_stats_is_the_ring_stats_typed_dict() -> None:
    listener = TcpCollective.bind("127.0.0.1")
    ring = TcpCollective.connect(listener, 0, [listener.address()], TOKEN, timeout=5.0)
    ring.allgather_bytes(b"x")
    stats: RingStats = ring.stats()
    assert set(stats) == set(RingStats.__annotations__), stats
    for key, value in stats.items():
        assert type(value) is RingStats.__annotations__[key], (key, value)
    assert stats["collectives"] == 1
