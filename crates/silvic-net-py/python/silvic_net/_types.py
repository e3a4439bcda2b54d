"""The names the binding's errors and ``stats()`` use, as types a checker can hold them to.

``CollectiveErrorKind``, ``ConnectErrorKind`` and ``RejectReasonName`` list every value the
Rust crate gives (``CollectiveError::kind``, ``ConnectError::kind``, ``RejectReason::name``);
a kind, once given, is never renamed. ``AllreducePathName`` lists the paths ``connect`` and
``from_env`` take as ``allreduce`` (``AllreducePath::name``, the values of ``SILVIC_ALLREDUCE``). :class:`RingStats` is the dict ``TcpCollective.stats()``
returns.
"""

from typing import Literal, TypedDict

__all__ = [
    "AllreducePathName",
    "CollectiveErrorKind",
    "ConnectErrorKind",
    "RejectReasonName",
    "RingStats",
]

AllreducePathName = Literal["auto", "ring", "gather", "bruck", "index"]

CollectiveErrorKind = Literal[
    "io",
    "peer_closed",
    "timeout",
    "out_of_step",
    "length_mismatch",
    "malformed_frame",
    "invalid_argument",
    "aborted",
]
ConnectErrorKind = Literal[
    "invalid_argument",
    "bind",
    "ports_taken",
    "no_interface",
    "environment",
    "folder",
    "duplicate_rank",
    "exchange_abandoned",
    "rejected",
    "handshake",
    "timeout",
    "io",
    "disagreement",
]
RejectReasonName = Literal[
    "token_mismatch", "version_mismatch", "world_mismatch", "wrong_rank", "address_mismatch"
]


class RingStats(TypedDict):
    """What a ring has done since ``connect``."""

    collectives: int
    """Collectives that returned."""
    bytes_sent: int
    bytes_received: int
    waited_left: float
    """Seconds spent waiting on the left neighbour (rank - 1)."""
    waited_right: float
    """Seconds spent waiting on the right neighbour (rank + 1)."""
