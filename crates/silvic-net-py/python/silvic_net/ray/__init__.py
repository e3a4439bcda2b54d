"""Rings of Ray actors: every actor binds, the driver gathers the addresses, every actor connects.

Mix :class:`RingMember` into an actor class, create the actors, and call :func:`form_ring` once
from the driver; each actor then has its rank of the ring as ``self.ring``::

    import ray
    from silvic_net.ray import RingMember, form_ring

    @ray.remote(num_cpus=1)
    class Trainer(RingMember):
        def step(self, histogram):
            self.ring.allreduce_sum_f64(histogram)  # every actor's histogram, summed in place
            return histogram

    trainers = [Trainer.remote() for _ in range(4)]
    form_ring(trainers)  # rank i is trainers[i]

For a Ray Train trainer (``DataParallelTrainer`` and friends), :mod:`silvic_net.ray.train` forms
the ring over the trainer's worker group instead, on every start and restart.

This module only gathers and hands out addresses; every check and every failure is the binding's
own (:class:`silvic_net.ConnectError`, :class:`silvic_net.CollectiveError`). It imports ``ray``
only when :func:`form_ring` runs or an actor binds, so ``import silvic_net.ray`` works without it.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Optional, Sequence

from silvic_net import RingListener, TcpCollective

__all__ = ["RingMember", "form_ring"]

# The ring and the listener live under these names on the actor, out of the way of its own.
_RING = "_silvic_net_ring"
_LISTENER = "_silvic_net_listener"


class RingMember:
    """Mixin for a Ray actor class: gives the actor its rank of a ring, as ``self.ring``.

    :func:`form_ring` calls the two methods below on every actor; a launcher of its own can call
    them too (bind on every actor, gather the addresses in rank order, connect on every actor at
    once).
    """

    def silvic_net_bind(self, listen_host: Optional[str] = None) -> str:
        """Bind a listener on this node's IP (as Ray reports it) and return its address.

        With ``listen_host`` (such as ``"0.0.0.0"``) the listener binds there and advertises the
        node IP. A listener bound earlier and never connected is closed.
        """
        import ray

        node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        listener: RingListener
        if listen_host is None:
            listener = TcpCollective.bind(node_ip)
        else:
            listener = TcpCollective.bind_advertised(listen_host, node_ip)
        setattr(self, _LISTENER, listener)
        return listener.address()

    def silvic_net_connect(
        self, rank: int, addresses: Sequence[str], job_token: str, timeout: float
    ) -> int:
        """Join the ring as ``rank`` with the listener of :meth:`silvic_net_bind`; return the rank.

        A ring this actor had before is closed first. Raises :class:`silvic_net.ConnectError`.
        """
        listener = self.__dict__.pop(_LISTENER, None)
        if listener is None:
            raise RuntimeError("silvic_net_connect needs a listener: call silvic_net_bind first")
        setattr(self, _RING, None)  # close the old ring, if any, before joining the new one
        setattr(self, _RING, TcpCollective.connect(listener, rank, addresses, job_token, timeout))
        return rank

    @property
    def ring(self) -> TcpCollective:
        """This actor's rank of the ring formed by :func:`form_ring`."""
        ring: Optional[TcpCollective] = self.__dict__.get(_RING)
        if ring is None:
            raise RuntimeError(
                "this actor is in no ring yet: call silvic_net.ray.form_ring(actors) on the driver"
            )
        return ring


def form_ring(
    actors: Sequence[Any],
    *,
    timeout: float = 1800.0,
    listen_host: Optional[str] = None,
) -> list[str]:
    """Form one ring of ``actors`` (handles of :class:`RingMember` actors); rank i is actors[i].

    Every actor binds on its node's IP, the driver gathers the addresses in rank order, and every
    actor connects at once with a fresh random job token (made here, for this ring only; it
    reaches the actors as a task argument, as Ray carries any argument). ``timeout`` (seconds)
    bounds the rendezvous on every actor, then how long its collectives wait on a silent peer;
    an actor changes that later with ``self.ring.set_timeout``. Returns the addresses.

    Raises the first error an actor raised (a :class:`silvic_net.ConnectError`, wrapped by Ray)
    as soon as it happens, and ``ray.exceptions.GetTimeoutError`` if the actors do not answer
    within the timeout and a grace period (an actor busy in another call, for one). Calling it
    again on the same actors forms a new ring and closes the old one.
    """
    import ray

    if not actors:
        raise ValueError("form_ring needs at least one actor")
    for actor in actors:
        if not hasattr(actor, "silvic_net_bind"):
            raise TypeError(
                f"form_ring needs handles of actors whose class mixes in "
                f"silvic_net.ray.RingMember, got {actor!r}"
            )
    grace = max(10.0, 0.1 * timeout)
    addresses: list[str] = _get_all(
        [actor.silvic_net_bind.remote(listen_host) for actor in actors], timeout + grace, ray
    )
    job_token = secrets.token_hex(32)
    _get_all(
        [
            actor.silvic_net_connect.remote(rank, addresses, job_token, timeout)
            for rank, actor in enumerate(actors)
        ],
        timeout + grace,
        ray,
    )
    return addresses


def _get_all(refs: list[Any], timeout: float, ray: Any) -> list[Any]:
    """The results of ``refs`` in order, raising the first failure as soon as it is known."""
    deadline = time.monotonic() + timeout
    pending = list(refs)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ray.exceptions.GetTimeoutError(
                f"{len(pending)} of {len(refs)} actors did not answer within {timeout:.0f} s"
            )
        done, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        for ref in done:
            ray.get(ref)  # raises that actor's error now, not after the others time out
    results: list[Any] = ray.get(refs)
    return results
