"""silvic-net from Python: ring allreduce and allgather over TCP, one rank per process.

A thin binding of the Rust crate ``silvic-net``; its documentation reads true here::

    from silvic_net import TcpCollective

    listener = TcpCollective.bind_advertised("0.0.0.0", node_ip)  # or TcpCollective.bind(node_ip)
    addresses = gather(listener.address())  # every rank's, in rank order, by your launcher
    ring = TcpCollective.connect(listener, rank, addresses, job_token, timeout=1800.0)
    ring.set_timeout(60.0)
    ring.allreduce_sum_f64(histogram)  # 1-D C-contiguous numpy float64, reduced in place
    parts = ring.allgather_bytes(record)  # list of bytes, indexed by rank

For Ray actors, :mod:`silvic_net.ray` does the gathering in one call; for Ray Train,
:mod:`silvic_net.ray.train` forms the ring for a trainer's worker group.

While a collective runs on an array, the array is read-only to Python (another thread writing
it gets a ``ValueError``); it is writeable again when the call returns or raises. The library's
events (refused connections, a short job token, a long wait) reach :mod:`logging` under the
logger ``"silvic_net"``; levels set there take effect from the next ``connect`` or ``from_env``.
Every error the library raises is a :class:`SilvicError`: a :class:`ConnectError` (binding or
joining) or a :class:`CollectiveError` (a collective), with a ``kind`` to branch on.

:class:`FixedHistogram` sums per-sample values exactly at a :class:`FixedScale` every rank
agrees on, so its results are the same bits for any world size or partition of the samples.
"""

from silvic_net._native import (
    LIVENESS,
    CollectiveError,
    ConnectError,
    FixedHistogram,
    FixedScale,
    RingListener,
    RingWatch,
    SilvicError,
    TcpCollective,
    __version__,
)
from silvic_net._types import (
    AllreducePathName,
    CollectiveErrorKind,
    ConnectErrorKind,
    PeerStats,
    RejectReasonName,
    RingStats,
)

__all__ = [
    "LIVENESS",
    "AllreducePathName",
    "CollectiveError",
    "CollectiveErrorKind",
    "ConnectError",
    "ConnectErrorKind",
    "FixedHistogram",
    "FixedScale",
    "PeerStats",
    "RejectReasonName",
    "RingListener",
    "RingStats",
    "RingWatch",
    "SilvicError",
    "TcpCollective",
    "__version__",
]
