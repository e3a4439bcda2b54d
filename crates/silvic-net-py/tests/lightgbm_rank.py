"""One rank of a LightGBM training, run as a process by test_lightgbm.py.

``python lightgbm_rank.py NETWORK TREE_LEARNER QUANTIZED EXIT_AT``: NETWORK is ``silvic`` (the
ring from ``TcpCollective.from_env``, made LightGBM's network by ``silvic_net.lightgbm``) or
``socket`` (LightGBM's own network, ``machines`` from ``LGBM_MACHINES``, this rank's port from
``LGBM_PORT``); rank and world come from ``RANK`` and ``WORLD_SIZE``. EXIT_AT is the iteration at
which rank ``EXIT_RANK`` ends its process (-1: none); rank ``ODD_RANK`` trains with
``ODD_LEAVES`` leaves (a rank whose LightGBM calls differ); rank ``MISCOUNT_RANK`` starts
LightGBM's network by hand with one machine too many (so LightGBM passes the hooks one block too
many). Prints one JSON line: the trees, or the error ``lgb.train`` raised and when.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

import lightgbm as lgb
import numpy as np

ROUNDS = 20


def partition(rank: int, world: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """This rank's rows of one seeded data set: every rank's partition differs."""
    rng = np.random.default_rng(20260)
    x = rng.normal(size=(1200 * world, 12))
    y = x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] * x[:, 3] + rng.normal(scale=0.1, size=len(x))
    return x[rank::world], y[rank::world]


def miscounted(ring: Any, params: dict[str, Any], x: Any, y: Any) -> Any:
    """Trains over `ring` as ``silvic_net.lightgbm.network`` would, but with LightGBM's network
    started for one machine more than the ring has."""
    from silvic_net import _native

    basic = lgb.basic
    rank, world, reduce_scatter, allgather = _native._lightgbm_lend(ring)
    try:
        basic._safe_call(
            basic._LIB.LGBM_NetworkInitWithFunctions(
                ctypes.c_int(world + 1),
                ctypes.c_int(rank),
                ctypes.c_void_p(reduce_scatter),
                ctypes.c_void_p(allgather),
            )
        )
        try:
            data = lgb.Dataset(x, y, params=params)
            return lgb.train(params, data, num_boost_round=ROUNDS)
        finally:
            basic._safe_call(basic._LIB.LGBM_NetworkFree())
    finally:
        _native._lightgbm_return(ring)


def main() -> None:
    network, tree_learner, quantized, exit_at = sys.argv[1:5]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    exit_rank = int(os.environ.get("EXIT_RANK", "-1"))
    params: dict[str, Any] = {
        "objective": "regression",
        "tree_learner": tree_learner,
        "num_machines": world,
        "pre_partition": True,
        "num_leaves": 15,
        "min_data_in_leaf": 5,
        "num_threads": 1,
        "deterministic": True,
        "force_col_wise": True,
        "seed": 1,
        "verbose": -1,
        "use_quantized_grad": quantized == "1",
    }
    if rank == int(os.environ.get("ODD_RANK", "-1")):
        params["num_leaves"] = int(os.environ["ODD_LEAVES"])

    def exit_early(env: Any) -> None:
        if env.iteration == int(exit_at) and rank == exit_rank:
            print(json.dumps({"exited": time.time()}), flush=True)
            os._exit(3)

    x, y = partition(rank, world)
    try:
        if network == "silvic":
            import silvic_net.lightgbm
            from silvic_net import TcpCollective

            ring = TcpCollective.from_env(60.0)
            if rank == int(os.environ.get("MISCOUNT_RANK", "-1")):
                booster = miscounted(ring, params, x, y)
            else:
                with silvic_net.lightgbm.network(ring):
                    data = lgb.Dataset(x, y, params=params)
                    booster = lgb.train(
                        params, data, num_boost_round=ROUNDS, callbacks=[exit_early]
                    )
        else:
            params["machines"] = os.environ["LGBM_MACHINES"]
            params["local_listen_port"] = int(os.environ["LGBM_PORT"])
            params["time_out"] = 1
            data = lgb.Dataset(x, y, params=params)
            booster = lgb.train(params, data, num_boost_round=ROUNDS, callbacks=[exit_early])
    except lgb.basic.LightGBMError as e:
        print(json.dumps({"error": str(e), "at": time.time()}), flush=True)
        return
    trees = booster.dump_model()["tree_info"]
    print(json.dumps({"trees": trees, "rounds": booster.current_iteration()}), flush=True)


if __name__ == "__main__":
    main()
