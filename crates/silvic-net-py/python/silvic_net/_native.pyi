"""Type stubs of the native module; import from ``silvic_net``."""

from typing import Callable, Final, Literal, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

from silvic_net._types import (
    AllreducePathName,
    CollectiveErrorKind,
    ConnectErrorKind,
    PeerStats,
    RejectReasonName,
    RingStats,
)

__all__ = [
    "TcpCollective",
    "RingListener",
    "SilvicError",
    "RingWatch",
    "FixedScale",
    "FixedHistogram",
    "CollectiveError",
    "ConnectError",
    "LIVENESS",
    "__version__",
    "_lightgbm_lend",
    "_lightgbm_return",
    "_lightgbm_take_signal",
]

__version__: Final[str]
LIVENESS: Final[float]
"""Seconds within which TCP itself fails a connection to a host that stopped answering."""

class SilvicError(Exception):
    """The base of :class:`CollectiveError` and :class:`ConnectError`: ``except SilvicError``
    catches every failure of the library (bad arguments raise ``TypeError``/``ValueError``)."""

class CollectiveError(SilvicError):
    """A collective failed; the ring is closed and every later call raises the same error.

    ``kind`` is one of ``"io"``, ``"peer_closed"``, ``"timeout"``, ``"out_of_step"``,
    ``"length_mismatch"``, ``"malformed_frame"`` or ``"aborted"`` (another rank failed first and
    told this one why: ``origin`` is that rank, ``origin_error`` what it saw).
    ``peer`` is the rank involved (for ``"aborted"``, the rank the origin's error named).
    The attributes are set on every error the binding raises (not on one built by hand), and
    the ``RayTaskError(CollectiveError)`` that ``ray.get`` raises shows them too.
    """

    kind: CollectiveErrorKind
    peer: Optional[int]
    origin: Optional[int]
    origin_error: Optional[CollectiveError]

class ConnectError(SilvicError):
    """Binding or joining a ring failed.

    ``kind`` is one of ``"invalid_argument"``, ``"bind"``, ``"rejected"`` (``reason`` says why:
    ``"token_mismatch"``, ``"version_mismatch"``, ``"world_mismatch"``, ``"wrong_rank"``,
    ``"address_mismatch"``), ``"handshake"``, ``"timeout"``, ``"io"``, ``"ports_taken"`` (every
    port of a range is taken), ``"no_interface"`` (the message names the interfaces that exist),
    ``"environment"`` (``from_env``: the message starts with the variable at fault), ``"folder"``
    (``path`` is the rendezvous file or folder), ``"duplicate_rank"`` (``peer`` is the rank two
    processes claim) or ``"disagreement"`` (ranks were started with different allreduce paths:
    the message names each rank that differs and its path, ``peer`` the first of them). ``peer`` is the rank involved and ``address`` its network address, when
    known: a ``"timeout"`` of ``from_env``'s rendezvous names the first rank missing, which gave
    no address (the message lists every rank missing).
    """

    kind: ConnectErrorKind
    peer: Optional[int]
    address: Optional[str]
    path: Optional[str]
    reason: Optional[RejectReasonName]

def _lightgbm_lend(ring: TcpCollective) -> Tuple[int, int, int, int]:
    """Move ``ring`` into LightGBM's network hooks; its rank, world size and the hooks' addresses
    (use :func:`silvic_net.lightgbm.network`)."""

def _lightgbm_return(ring: TcpCollective) -> None:
    """Move the ring lent by :func:`_lightgbm_lend` back into ``ring``."""

def _lightgbm_take_signal() -> Optional[BaseException]:
    """What a signal handler raised in a LightGBM hook since the last call (its collective
    cancelled), if anything."""

@final
class RingListener:
    """A bound listening socket, to be handed to :meth:`TcpCollective.connect` once."""

    def address(self) -> str:
        """The address other ranks connect to: ``"ip:port"``, or ``"[ip]:port"`` for IPv6."""

@final
class RingWatch:
    """A ring's progress, readable from any thread while its collective runs."""

    def progress(self) -> dict[str, Union[int, float, str, bool, None]]:
        """Where the ring stands now.

        Keys: ``entered`` and ``completed`` (collectives begun, and returned without error,
        since connect), ``index`` (int) and ``op`` (str) of the collective running now and
        ``in_call`` (seconds it has run), all ``None`` between calls; ``since_return`` (seconds
        since the last call returned, ``None`` before the first) and ``failed`` (bool: a call
        failed and the ring is closed). Ranks of one ring count calls alike: while some are in
        call ``index``, a rank whose ``entered`` is at most ``index`` has not reached it.
        """

@final
class TcpCollective:
    """One rank of a TCP ring. Used by one thread at a time; not picklable."""

    @staticmethod
    def bind(host: str) -> RingListener:
        """Listen on an ephemeral port of ``host`` (an address other ranks can reach)."""

    @staticmethod
    def bind_advertised(host: str, node_ip: str) -> RingListener:
        """Listen on ``host`` (such as ``"0.0.0.0"``) and advertise ``node_ip`` with its port."""

    @staticmethod
    def bind_with(
        host: Optional[str] = None,
        interface: Optional[str] = None,
        advertise: Optional[str] = None,
        port: Optional[int] = None,
        ports: Union[range, Tuple[int, int], None] = None,
    ) -> RingListener:
        """Listen on ``host`` or on ``interface``'s address (such as ``"eth0"``), on ``port`` or
        the first free port of ``ports`` (``range(29500, 29600)`` or inclusive ``(29500, 29599)``),
        advertising ``advertise`` if given. Raises :class:`ConnectError`."""

    @staticmethod
    def from_env(timeout: float, allreduce: AllreducePathName = "auto") -> TcpCollective:
        """Form the ring from a launcher's variables (``SILVIC_RANK``/``SILVIC_WORLD_SIZE`` or
        torchrun's, Slurm's, OpenMPI's; ``SILVIC_RENDEZVOUS``; ``SILVIC_JOB_TOKEN``; optional
        ``SILVIC_SOCKET_IFNAME``, ``SILVIC_PORTS`` and ``SILVIC_ALLREDUCE``). ``timeout``
        (seconds) bounds the start, then each collective's wait; ``allreduce`` as for
        :meth:`connect`. Raises :class:`ConnectError` naming the variable or rank."""

    @staticmethod
    def connect(
        listener: RingListener,
        rank: int,
        addresses: Sequence[str],
        job_token: str,
        timeout: float,
        allreduce: AllreducePathName = "auto",
    ) -> TcpCollective:
        """Join the ring as ``rank`` of ``len(addresses)``; consumes ``listener``.

        ``timeout`` (seconds) bounds the rendezvous, then each collective's wait on a silent
        peer. ``allreduce`` forces every allreduce onto one path where that path can carry the
        call (``"bruck"`` and ``"index"`` need chord streams, formed from 8 ranks; ``"gather"``
        and ``"bruck"`` hold every rank's buffer, so only within the gather's memory bound);
        ``"auto"`` leaves the choice to ``SILVIC_ALLREDUCE``, else to the network. Every rank
        must take the same path, or every rank raises :class:`ConnectError` of kind
        ``"disagreement"``. The GIL is released while the ring forms. Raises
        :class:`ConnectError`.
        """

    def set_timeout(self, timeout: float) -> None:
        """Set how long later collectives wait (seconds) on a peer that makes no progress."""

    @property
    def timeout(self) -> float:
        """The current collective timeout, in seconds."""

    @property
    def rank(self) -> int:
        """This rank, from 0 to ``world_size - 1``."""

    @property
    def world_size(self) -> int:
        """The number of ranks in the ring."""

    def stats(self) -> RingStats:
        """What this ring has done since connect (a new dict at every call).

        Keys: ``collectives``, ``bytes_sent``, ``bytes_received`` (ints), ``waited_left`` and
        ``waited_right`` (seconds spent waiting on each neighbour).
        """

    def peer_stats(self) -> list[PeerStats]:
        """The same per stream (a new list at every call): a dict for each peer this rank
        holds a stream to, the two neighbours first, then the chord peers (from 8 ranks).

        Keys: ``peer`` (its rank), ``offset`` (-1, +1 or a chord's +-2**k), ``bytes_sent``,
        ``bytes_received`` (ints), ``waited`` (seconds) and ``channel`` (0, or the channel of a
        ring split over ``SILVIC_CHANNELS``). A world of one has none.
        """

    def watch(self) -> RingWatch:
        """A :class:`RingWatch` of this ring, for another thread to poll while a collective
        runs. Take it on the ring's own thread (the ring is borrowed during a collective)."""

    def allreduce_sum_f64(self, buf: npt.NDArray[np.float64]) -> None:
        """Sum ``buf`` (1-D, C-contiguous, writeable float64) across ranks, in place.

        Every allreduce makes ``buf`` read-only to Python while it runs (another thread writing
        it gets a ``ValueError``) and writeable again when it returns or raises.
        """

    def allreduce_sum_i64(self, buf: npt.NDArray[np.int64]) -> None:
        """Sum ``buf`` (1-D, C-contiguous, writeable int64) across ranks, in place; sums wrap."""

    def allreduce_max_f64(self, buf: npt.NDArray[np.float64]) -> None:
        """Element-wise maximum of ``buf`` (float64) across ranks, in place; NaN propagates."""

    def allgather_bytes(self, local: bytes) -> list[bytes]:
        """Every rank's ``local``, indexed by rank. Every rank passes the same length."""

    def allreduce(
        self,
        buf: Union[
            npt.NDArray[np.float32],
            npt.NDArray[np.float64],
            npt.NDArray[np.int32],
            npt.NDArray[np.int64],
            npt.NDArray[np.uint64],
        ],
        op: Literal["sum", "min", "max"],
    ) -> None:
        """Reduce ``buf`` (1-D, C-contiguous, writeable; float32, float64, int32, int64 or
        uint64; or an ``(n, 2)`` int64 array of ``n`` i128s, each the low 64 bits then the high
        ones, whose sums are exact and the same for any world) across ranks in place. Sums of floats fold in the ring's fixed rank order, so
        every rank gets the same bits; integer sums wrap; min and max of floats propagate NaN.
        A sum of float64 is the same op as :meth:`allreduce_sum_f64` (and so for the other two
        pinned ones). Raises ``TypeError``/``ValueError`` for a bad array or op, before anything
        is sent."""

    def reduce_scatter_records(
        self,
        data: bytes,
        blocks: Sequence[int],
        record: int,
        fold: Callable[[bytes, bytes], bytes],
    ) -> bytes:
        """This rank's block of ``data`` folded over every rank.

        ``data`` is cut into ``blocks`` (one length in bytes per rank, end to end, each a whole
        number of ``record``-byte records, possibly none); rank ``i`` gets block ``i`` folded,
        record by record, over ranks ``i + 1, i + 2, ..., i`` (mod world):
        ``acc = fold(acc, next)``, where ``fold`` gets runs of whole records as bytes and returns
        the folded accumulator (the same length). The GIL is taken for each call of ``fold``.
        If ``fold`` raises, the ring still finishes in step and its first error is raised.
        """

    def allreduce_records(
        self, data: bytes, record: int, fold: Callable[[bytes, bytes], bytes]
    ) -> bytes:
        """``data`` (whole ``record``-byte records) folded over every rank: one block of records
        per rank folded as :meth:`reduce_scatter_records` does, then gathered."""

    def allgather_varlen(self, local: bytes) -> list[bytes]:
        """Every rank's ``local``, indexed by rank; each rank may pass any length."""

    def allgather_blocks(self, local: bytes, blocks: Sequence[int]) -> bytes:
        """Every rank's block, end to end, when every rank knows every length: ``blocks`` holds
        one length per rank (the same on every rank), ``local`` this rank's bytes. One round of
        frames, where :meth:`allgather_varlen` first learns the lengths."""

    def broadcast_bytes(self, data: bytes, root: int) -> bytes:
        """Rank ``root``'s ``data``, on every rank (what the other ranks pass is discarded)."""

@final
class FixedScale:
    """The power-of-two quantum of a :class:`FixedHistogram`, agreed by every rank from the
    data alone. Values are held as whole numbers of quanta of ``2**-exponent``, each rounded
    once (to nearest, ties to even); every value added must be below ``bound`` in magnitude.

    With ``M < 2**m`` the global max and ``N <= 2**k`` the global rows, ``exponent`` is
    ``126 - k - m``: values down to ``2**(m + k - 74)`` are held exactly, smaller ones are off
    by at most half a quantum, and no sum of ``N`` values can overflow.
    """

    @staticmethod
    def agree(ring: TcpCollective, max_abs: float, rows: int) -> FixedScale:
        """Agree the scale with every rank of ``ring`` in one small collective: ``max_abs`` is
        the largest ``|value|`` this rank will add, ``rows`` the most values it will add to any
        one bin. The scale depends on the largest max and the total rows alone."""

    @property
    def exponent(self) -> int:
        """Values are held as whole numbers of quanta of ``2**-exponent``."""

    @property
    def bound(self) -> float:
        """Every value added must be below this in magnitude (a power of two, or infinity)."""

    @property
    def local_rows(self) -> int:
        """The rows this rank declared: its headroom."""

@final
class FixedHistogram:
    """Per-bin exact sums of per-sample values at an agreed :class:`FixedScale`: ``add`` each
    batch of samples, ``allreduce`` once on every rank, and ``to_f64`` gives every bin's exact
    total rounded once, the same bits for any world or partition of the samples."""

    def __new__(cls, bins: int, scale: FixedScale) -> FixedHistogram:
        """``bins`` empty bins at ``scale``."""

    @property
    def bins(self) -> int:
        """The number of bins."""

    @property
    def scale(self) -> FixedScale:
        """The scale the sums are held at."""

    def add(self, bins: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> None:
        """Add ``values[i]`` to bin ``bins[i]`` for every ``i`` (1-D contiguous arrays of one
        length): all of them, or, if one is refused, none. A refused value raises
        :class:`CollectiveError` (kind ``"overflow"`` or ``"invalid_argument"``) and fails the
        next :meth:`allreduce` on every rank."""

    def allreduce(self, ring: TcpCollective) -> None:
        """Sum every bin over every rank of ``ring``, exactly. Raises :class:`CollectiveError`
        on every rank alike where a rank holds another scale (``"scale_mismatch"``), refused a
        value, or reduced this histogram already (``"overflow"``); the histogram is emptied."""

    def to_f64(self) -> npt.NDArray[np.float64]:
        """Each bin's sum: one correct rounding of its exact total."""

    def sums(self) -> npt.NDArray[np.int64]:
        """Each bin's exact sum in quanta of ``2**-scale.exponent``, as an ``(n, 2)`` int64
        array of i128s (low 64 bits, then high)."""
