"""One rank of tests/test_interrupt.py: forms its ring with ``TcpCollective.from_env`` (world,
rank and rendezvous from the environment), says where it is on stdout, one line at a time,
and reports how its call ended. ``start`` mode: the interrupted call is from_env itself;
``collective`` mode: two allreduces, which rank ``LATE_RANK`` enters only after ``LATE_SECONDS``;
``lightgbm`` mode: a LightGBM training over the ring, which rank ``LATE_RANK`` starts as late.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from silvic_net import CollectiveError, ConnectError, TcpCollective


def say(text: str) -> None:
    print(f"{text} at={time.time():.3f}", flush=True)


def main() -> int:
    # Ctrl-C as at a terminal, however the tests were started: a process started with SIGINT
    # ignored (a background job of a non-interactive shell, as `cmd &` in a script starts it)
    # passes the ignoring on to the ranks, whose Python then raises no KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mode = sys.argv[1]
    rank = int(os.environ["SILVIC_RANK"])
    try:
        say("STARTING")
        ring = TcpCollective.from_env(float(os.environ["TIMEOUT"]))
        say("CONNECTED")
        if mode == "collective":
            if rank == int(os.environ["LATE_RANK"]):
                time.sleep(float(os.environ["LATE_SECONDS"]))
            # Two calls: a late rank whose first call found every frame it needed already sent
            # (the others' data goes out before their abort) fails at its next.
            for _ in range(2):
                say("CALLING")
                ring.allreduce_sum_f64(np.ones(8))
                say("SUMMED")
        if mode == "lightgbm":
            # Imported before CALLING, so that a SIGINT sent after it finds this rank in
            # LightGBM's network hook, not still importing LightGBM (seconds on a loaded
            # machine), where the interrupt would end the process before any call to cancel.
            import lightgbm  # noqa: F401
            import silvic_net.lightgbm  # noqa: F401

            if rank == int(os.environ["LATE_RANK"]):
                time.sleep(float(os.environ["LATE_SECONDS"]))
            say("CALLING")
            train(ring)
            say("TRAINED")
    except KeyboardInterrupt:
        say("INTERRUPTED")
        return 130
    except (CollectiveError, ConnectError) as e:
        origin = getattr(e, "origin", None)
        say(f"FAILED kind={e.kind} peer={e.peer} origin={origin} message={e}")
        return 3
    except Exception as e:  # LightGBM's error, its text naming the rank
        say(f"FAILED kind={type(e).__name__} message={' '.join(str(e).split())}")
        return 3
    return 0


def train(ring: TcpCollective) -> None:
    """A data-parallel LightGBM training over ``ring``, this rank's rows of one data set."""
    import lightgbm as lgb

    from silvic_net.lightgbm import network

    rng = np.random.default_rng(7)
    x = rng.normal(size=(600 * ring.world_size, 6))
    y = x[:, 0] - x[:, 1] * x[:, 2]
    mine = slice(ring.rank, None, ring.world_size)
    params = {"objective": "regression", "tree_learner": "data", "num_machines": ring.world_size,
              "pre_partition": True, "num_threads": 1, "verbose": -1}
    with network(ring):
        lgb.train(params, lgb.Dataset(x[mine], y[mine], params=params), num_boost_round=5)


if __name__ == "__main__":
    sys.exit(main())
