"""Ray Train over silvic-net: one ring over a trainer's worker group, formed on every (re)start.

Give the trainer a :class:`SilvicConfig` and call :func:`get_ring` in the train loop::

    import ray.train
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from silvic_net.ray.train import HangReport, PlacementCheck, SilvicConfig, get_ring

    def train_loop(config):
        ring = get_ring()  # ring.rank == ray.train.get_context().get_world_rank()
        for step in range(...):
            ring.allreduce_sum_f64(histogram)
            ray.train.report(metrics, checkpoint=...)

    trainer = DataParallelTrainer(
        train_loop,
        backend_config=SilvicConfig(timeout=600.0),
        scaling_config=ScalingConfig(num_workers=4),
        run_config=RunConfig(failure_config=FailureConfig(max_failures=3),
                             callbacks=[PlacementCheck(),
                                        HangReport(report_after=60.0, fail_after=600.0)]),
    )
    trainer.fit()

What the backend keeps, on every attempt (every start of a worker group, restarts included):

- Every worker binds on its node's IP (or where :class:`SilvicConfig` says) and keeps the
  listener until it connects: no port is released and bound again, so nothing can take it
  between.
- The addresses are gathered in Ray Train's world-rank order, so ``get_ring().rank`` is the
  worker's world rank; every worker connects at once, with a job token made afresh for the
  attempt (a worker of an earlier attempt cannot join, nor be joined).
- The ring closes when the group shuts down. A worker that dies makes every survivor's
  collective raise :class:`silvic_net.CollectiveError` naming it within moments (its sockets
  close), so the group fails at once and Ray Train's ``FailureConfig`` decides: a new group, a
  new ring, and the train loop resumes from ``ray.train.get_checkpoint()``.

:class:`PlacementCheck` is a Ray Train callback that fails a run at once when the cluster's
nodes cannot hold every worker of the group (Ray Train places the group before the backend
runs, and on a cluster without an autoscaler waits and retries instead).

:class:`HangReport` is a Ray Train callback that polls every worker's :class:`silvic_net.RingWatch`
and, when a collective has waited longer than a threshold, logs which rank the others wait on
(and where that rank's train loop is), then can fail the run with a :class:`RingHangError`
naming it. It uses Ray Train v2's callback interface; the backend works on v1 too.

This module imports ``ray.train``; :mod:`silvic_net.ray` does not.
"""

from __future__ import annotations

import logging
import secrets
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import ray
from ray.train._internal.base_worker_group import BaseWorkerGroup
from ray.train.backend import Backend, BackendConfig

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from silvic_net import RingListener, RingWatch, TcpCollective
from silvic_net.ray import PlacementError, _get_all
from silvic_net.ray._worker import _lock, _train_thread, _worker
from silvic_net.ray.hang import HangReport, RingHangError

__all__ = [
    "HangReport",
    "PlacementCheck",
    "PlacementError",
    "RingHangError",
    "SilvicConfig",
    "get_ring",
]

logger = logging.getLogger("silvic_net.ray.train")


@dataclass
class SilvicConfig(BackendConfig):
    """The backend config of a trainer whose workers share one silvic-net ring.

    ``timeout`` (seconds) bounds the ring's forming on every worker, then how long a collective
    waits on a silent peer, unless ``collective_timeout`` sets that apart. Where to listen:
    by default on the node's IP as Ray reports it; ``interface`` (such as ``"eth0"``) listens on
    that interface's address and advertises it; ``listen_host`` (such as ``"0.0.0.0"``) listens
    there and advertises the node's IP. ``ports`` (``range(29500, 29600)`` or an inclusive
    ``(29500, 29599)``) takes the first free port of a range, for firewalls; by default an
    ephemeral port.
    """

    timeout: float = 1800.0
    collective_timeout: Optional[float] = None
    interface: Optional[str] = None
    listen_host: Optional[str] = None
    ports: Union[range, Tuple[int, int], None] = None

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout}")
        if self.collective_timeout is not None and not self.collective_timeout > 0:
            raise ValueError(
                f"collective_timeout must be a positive number of seconds, "
                f"got {self.collective_timeout}"
            )
        if self.interface is not None and self.listen_host is not None:
            raise ValueError("SilvicConfig takes interface or listen_host, not both")

    @property
    def backend_cls(self) -> type[_SilvicBackend]:
        return _SilvicBackend

    @property
    def train_func_context(self) -> Callable[[], AbstractContextManager[None]]:
        return _train_thread

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "collective_timeout": self.collective_timeout,
            "interface": self.interface,
            "listen_host": self.listen_host,
            "ports": None if self.ports is None else str(self.ports),
        }


def get_ring() -> TcpCollective:
    """This worker's rank of the ring its trainer's :class:`SilvicConfig` formed.

    ``ring.rank`` is the worker's world rank and ``ring.world_size`` the number of workers. Raises
    ``RuntimeError`` outside a worker of such a trainer.
    """
    with _lock:
        ring = _worker.ring
    if ring is None:
        raise RuntimeError(
            "this process has no silvic-net ring: call get_ring() inside the train loop of a "
            "Ray Train trainer given backend_config=silvic_net.ray.train.SilvicConfig()"
        )
    return ring


def _world_rank() -> int:
    rank: int = ray.train.get_context().get_world_rank()
    return rank


def _bind(
    interface: Optional[str], listen_host: Optional[str], ports: Union[range, Tuple[int, int], None]
) -> Tuple[int, str]:
    """On a worker: bind this attempt's listener and keep it; return (world rank, address)."""
    node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if interface is not None:
        listener = TcpCollective.bind_with(interface=interface, ports=ports)
    elif listen_host is not None:
        listener = TcpCollective.bind_with(host=listen_host, advertise=node_ip, ports=ports)
    else:
        listener = TcpCollective.bind_with(host=node_ip, ports=ports)
    with _lock:
        _worker.listener = listener
    return _world_rank(), listener.address()


def _connect(
    addresses: Sequence[str], job_token: str, timeout: float, collective_timeout: Optional[float]
) -> int:
    """On a worker: join the ring as its world rank with the listener of :func:`_bind`."""
    with _lock:
        listener, _worker.listener = _worker.listener, None
        _worker.ring = _worker.watch = None  # an earlier ring of this process closes first
    if listener is None:
        raise RuntimeError("silvic-net: connect before bind on this worker")
    ring = TcpCollective.connect(listener, _world_rank(), addresses, job_token, timeout)
    if collective_timeout is not None:
        ring.set_timeout(collective_timeout)
    with _lock:
        _worker.ring, _worker.watch = ring, ring.watch()
    return ring.rank


def _close() -> None:
    """On a worker: drop the ring (its sockets close unless the train loop still holds it;
    Ray ends the worker's process right after) and any listener not yet connected."""
    with _lock:
        _worker.ring = _worker.watch = _worker.listener = None


class _SilvicBackend(Backend):
    """Forms the ring when a worker group starts its training, drops it when the group shuts
    down. Ray Train makes one instance per process (a singleton) and calls it from its
    controller, once per attempt."""

    def on_training_start(
        self, worker_group: BaseWorkerGroup, backend_config: BackendConfig
    ) -> None:
        started = time.monotonic()
        config = backend_config
        if not isinstance(config, SilvicConfig):
            raise TypeError(f"the silvic-net backend needs a SilvicConfig, got {type(config)}")
        grace = max(10.0, 0.1 * config.timeout)
        bound: list[Tuple[int, str]] = _get_all(
            worker_group.execute_async(_bind, config.interface, config.listen_host, config.ports),
            config.timeout + grace,
            ray,
        )
        by_rank = dict(bound)
        if sorted(by_rank) != list(range(len(bound))):
            raise RuntimeError(f"silvic-net: the workers' world ranks are not 0..n-1: {bound}")
        addresses = [by_rank[rank] for rank in range(len(bound))]
        job_token = secrets.token_hex(32)  # this attempt's alone
        _get_all(
            worker_group.execute_async(
                _connect, addresses, job_token, config.timeout, config.collective_timeout
            ),
            config.timeout + grace,
            ray,
        )
        logger.debug(
            "silvic-net ring of %d workers formed in %.2f s: %s",
            len(addresses),
            time.monotonic() - started,
            " -> ".join(addresses),
        )

    def on_shutdown(self, worker_group: BaseWorkerGroup, backend_config: BackendConfig) -> None:
        # Workers may be dead already (that is often why the group shuts down): close the
        # survivors' rings, wait a little, and raise nothing.
        refs: list[Any] = worker_group.execute_async(_close)
        ray.wait(refs, num_returns=len(refs), timeout=5.0)


class PlacementCheck(WorkerGroupCallback):
    """A Ray Train callback (``RunConfig(callbacks=[PlacementCheck()])``) that fails a run at
    once, with a :class:`silvic_net.ray.PlacementError`, when the cluster's nodes cannot hold
    every worker of the group about to start, instead of waiting for them.

    Ray Train places the whole worker group before any backend runs (the silvic-net backend
    sees the workers only once they all run), and on a cluster without an autoscaler it does
    not compare the group with the cluster: it waits ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``
    (60 s), then starts again, forever by default. This callback runs before each start: it
    counts how many workers of ``ScalingConfig``'s size fit on the live nodes, each node's
    total resources against each worker's (with the placement strategy's rule: one node for
    ``STRICT_PACK``, one worker a node for ``STRICT_SPREAD``), and raises naming how many do
    not fit, what each worker asks for, and what the cluster has (and has free now). Where
    Ray knows the most the cluster can grow to (an autoscaler's config), Ray's own check
    decides and this one stays out; so does it where workers carry label selectors.
    """

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        context = worker_group_context
        if getattr(context, "label_selector", None):
            return
        if _autoscaling():
            return
        _check_fits(
            int(context.num_workers),
            {k: float(v) for k, v in context.resources_per_worker.items()},
            str(getattr(context, "placement_strategy", "PACK")),
        )


def _autoscaling() -> bool:
    """Whether Ray knows the most an autoscaler may grow the cluster to (then Ray checks)."""
    try:
        state: Any = ray._private.state.state
        return bool(state.get_max_resources_from_cluster_config())
    except Exception:  # noqa: BLE001 - an internal API: without it, assume a fixed cluster
        return False


def _check_fits(num_workers: int, per_worker: dict[str, float], strategy: str) -> None:
    """Raises :class:`PlacementError` if fewer than ``num_workers`` workers asking for
    ``per_worker`` each fit on the cluster's live nodes, by their total resources."""
    asked = {k: v for k, v in per_worker.items() if v > 0}
    if not asked or num_workers <= 0:
        return
    nodes = [
        {k: float(v) for k, v in node.get("Resources", {}).items()}
        for node in ray.nodes()  # type: ignore[no-untyped-call]
        if node.get("Alive")
    ]
    fit = _workers_that_fit(asked, nodes, strategy)
    if fit >= num_workers:
        return
    totals: dict[str, Any] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    free: dict[str, Any] = ray.available_resources()  # type: ignore[no-untyped-call]
    cluster = {k: float(v) for k, v in totals.items()}
    available = {k: float(v) for k, v in free.items()}
    each = ", ".join(f"{v:g} {k}" for k, v in asked.items())
    total = {k: v * num_workers for k, v in asked.items()}
    has = "; ".join(
        f"{total[k]:g} {k} in all, and the cluster has {cluster.get(k, 0.0):g} "
        f"({available.get(k, 0.0):g} free now)"
        for k in asked
    )
    largest = "; ".join(
        f"{max((n.get(k, 0.0) for n in nodes), default=0.0):g} {k}" for k in asked
    )
    how = {"STRICT_PACK": " on one node", "STRICT_SPREAD": ", one a node,"}.get(strategy, "")
    missing = list(range(fit, num_workers))
    raise PlacementError(
        f"Ray cannot place {num_workers - fit} of the trainer's {num_workers} workers: each "
        f"asks for {each} ({has}; the largest of the {len(nodes)} live "
        f"node{'s' if len(nodes) != 1 else ''} has {largest}), so only {fit} fit{how} and "
        f"the worker group can never start; ask for fewer workers or less of each "
        f"(ScalingConfig(num_workers=..., resources_per_worker=...)) or give the cluster more "
        f"(ray.init(num_cpus=...), more nodes)",
        missing,
        total,
        cluster,
    )


def _workers_that_fit(asked: dict[str, float], nodes: list[dict[str, float]], strategy: str) -> int:
    """How many workers asking for ``asked`` each the ``nodes`` (total resources) hold."""
    per_node = [
        min(int(node.get(k, 0.0) / v + 1e-9) for k, v in asked.items()) for node in nodes
    ]
    if strategy == "STRICT_PACK":
        return max(per_node, default=0)
    if strategy == "STRICT_SPREAD":
        return sum(min(n, 1) for n in per_node)
    return sum(per_node)
