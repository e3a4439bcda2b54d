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

This module gathers and hands out addresses; every check of the ring and every failure of it is
the binding's own (:class:`silvic_net.ConnectError`, :class:`silvic_net.CollectiveError`). Its
own check is Ray's: actors that Ray cannot place (the ring's actors ask for more than the
cluster has) fail :func:`form_ring` at once with a :class:`PlacementError` naming them. It
imports ``ray`` only when :func:`form_ring` runs or an actor binds, so ``import
silvic_net.ray`` works without it.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Callable, Optional, Sequence

from silvic_net import RingListener, TcpCollective

__all__ = ["PlacementError", "RingMember", "form_ring"]

_log = logging.getLogger(__name__)


class PlacementError(RuntimeError):
    """Ray cannot place some of :func:`form_ring`'s actors, or of a Ray Train worker group
    (:class:`silvic_net.ray.train.PlacementCheck`): together they ask for more of a resource
    (CPUs, GPUs, memory) than the cluster has, so they can never all run at once.

    ``ranks`` are the ranks of the actors Ray has not placed (for a worker group, not yet
    placed, the last world ranks, as many as do not fit); ``asked`` the resources asked in
    all, and ``cluster`` the cluster's (both as Ray names them: ``{"CPU": 4.0}``).
    """

    def __init__(
        self, message: str, ranks: list[int], asked: dict[str, float], cluster: dict[str, float]
    ) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.asked = asked
        self.cluster = cluster

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole: Ray Train raises it on its controller and hands it to the driver.
        return (type(self), (str(self), self.ranks, self.asked, self.cluster))

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

    Raises :class:`PlacementError` as soon as Ray shows that the actors cannot all run at once
    (some not placed, and together asking for more than the cluster has), naming them; the
    first error an actor raised (a :class:`silvic_net.ConnectError`, wrapped by Ray) as soon as
    it happens; and ``ray.exceptions.GetTimeoutError`` if the actors do not answer within the
    timeout and a grace period (an actor busy in another call, for one). While actors wait to
    be placed (the cluster busy with other work), it logs a warning naming them after 5 s and
    each time the wait doubles. Calling it again on the same actors forms a new ring and closes
    the old one.
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
    binds = [actor.silvic_net_bind.remote(listen_host) for actor in actors]
    addresses: list[str] = _get_all(binds, timeout + grace, ray, _Placement(actors, binds, ray))
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


def _get_all(
    refs: list[Any], timeout: float, ray: Any, check: Optional[Callable[[list[Any]], None]] = None
) -> list[Any]:
    """The results of ``refs`` in order, raising the first failure as soon as it is known;
    ``check`` is shown the refs still pending about once a second, and may raise."""
    deadline = time.monotonic() + timeout
    pending = list(refs)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ray.exceptions.GetTimeoutError(
                f"{len(pending)} of {len(refs)} actors did not answer within {timeout:.0f} s"
            )
        done, pending = ray.wait(pending, num_returns=1, timeout=min(remaining, 1.0))
        for ref in done:
            ray.get(ref)  # raises that actor's error now, not after the others time out
        if pending and check is not None:
            check(pending)
    results: list[Any] = ray.get(refs)
    return results


# Ray's states of an actor it has not placed (or not started) yet.
_UNPLACED = ("PENDING_CREATION", "DEPENDENCIES_UNREADY")


class _Placement:
    """Whether the ring's actors can run: Ray's own record of each actor (its state and the
    resources it asks for), against the cluster's resources.

    Ray's record is read through its internal GCS accessor (the public state API needs the
    dashboard); where that fails (another Ray version), nothing is checked and form_ring waits
    as before.
    """

    def __init__(self, actors: Sequence[Any], binds: list[Any], ray: Any) -> None:
        self.actors = actors
        self.rank_of = {ref: rank for rank, ref in enumerate(binds)}
        self.ray = ray
        self.started = time.monotonic()
        self.next_look = self.started
        self.warn_at = 5.0

    def __call__(self, pending: list[Any]) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + 1.0
        found = [self._record(actor) for actor in self.actors]
        records = [r for r in found if r is not None]
        if len(records) != len(found):
            return
        unplaced = [
            self.rank_of[ref] for ref in pending if records[self.rank_of[ref]][0] in _UNPLACED
        ]
        if not unplaced:
            return
        asked: dict[str, float] = {}
        for _, resources in records:
            for name, amount in resources.items():
                asked[name] = asked.get(name, 0.0) + amount
        cluster = {k: float(v) for k, v in self.ray.cluster_resources().items()}
        available = {k: float(v) for k, v in self.ray.available_resources().items()}
        short = {k: v for k, v in asked.items() if v > cluster.get(k, 0.0) + 1e-9}
        first = records[unplaced[0]][1]
        each = ", ".join(f"{v:g} {k}" for k, v in first.items()) or "no resources"
        names = _ranks(unplaced)
        if short:
            what = "; ".join(
                f"{v:g} {k} in all, and the cluster has {cluster.get(k, 0.0):g}"
                f" ({available.get(k, 0.0):g} free now)"
                for k, v in short.items()
            )
            raise PlacementError(
                f"Ray cannot place {len(unplaced)} of the ring's {len(self.actors)} actors "
                f"({names}: each asks for {each}): the actors ask for {what}, so they can never "
                "all run at once; ask less of each actor (@ray.remote(num_cpus=...)) or give "
                "the cluster more (ray.init(num_cpus=...), more nodes)",
                unplaced,
                asked,
                cluster,
            )
        waited = time.monotonic() - self.started
        if waited >= self.warn_at:
            self.warn_at *= 2
            free = ", ".join(f"{available.get(k, 0.0):g} {k}" for k in asked) or "nothing"
            _log.warning(
                "form_ring has waited %.0f s for Ray to place %s (each asks for %s; the cluster "
                "has %s free): other work holds the resources they need",
                waited,
                names,
                each,
                free,
            )

    def _record(self, actor: Any) -> Optional[tuple[str, dict[str, float]]]:
        """The actor's state and the resources it asks for, as Ray's GCS holds them."""
        try:
            import importlib

            # Generated protobuf code, without type stubs: looked up as Any.
            gcs_pb2: Any = importlib.import_module("ray.core.generated.gcs_pb2")
            accessor = self.ray._private.state.state._global_state_accessor
            raw = accessor.get_actor_info(actor._actor_id)
            if raw is None:
                return None
            table = gcs_pb2.ActorTableData
            data = table.FromString(raw)
            state: str = table.ActorState.Name(data.state)
            return state, {k: float(v) for k, v in data.required_resources.items()}
        except Exception:  # noqa: BLE001 - an internal API: without it, nothing is checked
            return None


def _ranks(ranks: list[int]) -> str:
    """``"ranks 2 and 3"``, ``"rank 1"``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"

