"""LightGBM's distributed training over a silvic-net ring.

::

    import lightgbm as lgb
    import silvic_net.lightgbm
    from silvic_net import TcpCollective

    ring = TcpCollective.from_env(timeout=1800.0)  # or TcpCollective.connect(...)
    params = {"tree_learner": "data", "num_machines": ring.world_size, "pre_partition": True}
    with silvic_net.lightgbm.network(ring):
        train = lgb.Dataset(features, label)  # this rank's partition
        booster = lgb.train(params, train, num_boost_round=100)

Inside the block the ring is LightGBM's network (``LGBM_NetworkInitWithFunctions``): LightGBM's
reduce-scatters and allgathers run over it, with silvic-net's rendezvous, timeouts and errors.
A failure inside LightGBM's network (a rank that died, a timeout, ranks out of step) makes
``lgb.train`` raise ``lightgbm.basic.LightGBMError`` on every surviving rank, with silvic-net's
message naming the rank; the process lives on, and the ring is closed (every later call raises
the same error). Build the ``lgb.Dataset`` inside the block too: with ``num_machines`` above 1
LightGBM finds its bins over the network.

LightGBM keeps its network per thread: train on the thread that entered the block. One block
at a time per process; while it runs the ring refuses calls from Python (``RuntimeError``).
The parallel tree learners LightGBM's C API runs are ``"data"`` and ``"voting"`` (it refuses
``"feature"``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
from typing import Any, Iterator

from silvic_net import _native
from silvic_net._native import TcpCollective

__all__ = ["network"]


def _library() -> Any:
    """LightGBM's loaded C library, imported only when a block is entered."""
    return importlib.import_module("lightgbm.basic")


@contextlib.contextmanager
def network(ring: TcpCollective) -> Iterator[TcpCollective]:
    """Make ``ring`` LightGBM's network for the block, and free it on exit.

    ``params`` of the training inside must carry ``num_machines`` equal to
    ``ring.world_size`` and a parallel ``tree_learner``. Yields ``ring``.

    Ctrl-C while LightGBM waits in the ring interrupts it: the block raises
    ``KeyboardInterrupt`` (from LightGBM's error), and the other ranks' LightGBM raises, naming
    this rank.
    """
    basic = _library()
    rank, world, reduce_scatter, allgather = _native._lightgbm_lend(ring)
    try:
        basic._safe_call(
            basic._LIB.LGBM_NetworkInitWithFunctions(
                ctypes.c_int(world),
                ctypes.c_int(rank),
                ctypes.c_void_p(reduce_scatter),
                ctypes.c_void_p(allgather),
            )
        )
        _native._lightgbm_take_signal()  # none from an earlier block
        try:
            yield ring
        except basic.LightGBMError as error:
            # Ctrl-C in a hook cancelled its collective and LightGBM raised: raise what the
            # signal handler raised (KeyboardInterrupt), as any interrupted call does.
            signal = _native._lightgbm_take_signal()
            if signal is not None:
                raise signal from error
            raise
        finally:
            basic._safe_call(basic._LIB.LGBM_NetworkFree())
    finally:
        _native._lightgbm_return(ring)
