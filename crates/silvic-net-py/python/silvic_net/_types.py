"""The names the binding's errors and ``stats()`` use, as types a checker can hold them to.

``CollectiveErrorKind``, ``ConnectErrorKind`` and ``RejectReasonName`` list every value the
Rust crate gives (``CollectiveError::kind``, ``ConnectError::kind``, ``RejectReason::name``);
a kind, once given, is never renamed. ``AllreducePathName`` lists the paths ``connect`` and
``from_env`` take as ``allreduce`` (``AllreducePath::name``, the values of
``SILVIC_ALLREDUCE``). :class:`RingStats` is the dict ``TcpCollective.stats()`` returns, and
:class:`PeerStats` each dict of ``TcpCollective.peer_stats()``.
"""

from typing import Literal, TypedDict

__all__ = [
    "AllreducePathName",
    "CollectiveErrorKind",
    "ConnectErrorKind",
    "PeerStats",
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
    "overflow",
    "scale_mismatch",
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


class PeerStats(TypedDict):
    """What a ring has done since ``connect`` on its stream to one peer."""

    peer: int
    """The rank at the other end."""
    offset: int
    """Where that rank sits round the ring: -1 the left neighbour, +1 the right one, +-2**k a
    chord."""
    bytes_sent: int
    bytes_received: int
    waited: float
    """Seconds spent waiting on this peer."""
    channel: int
    """The channel the stream carries: 0 the ring's own streams, c > 0 those of channel c
    (``SILVIC_CHANNELS``)."""
