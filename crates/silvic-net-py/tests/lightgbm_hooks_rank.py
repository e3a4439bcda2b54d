"""One rank calling LightGBM's network hooks by hand, run as a process by
test_lightgbm_hooks.py: what LightGBM would pass, except where this rank is told to pass
something broken.

``python lightgbm_hooks_rank.py HOOK BROKEN``: HOOK is ``allgather`` or ``reduce_scatter``;
BROKEN is what rank ``BROKEN_RANK`` passes wrong: ``num_block`` (one block more than the world
has), ``output`` (a null output), ``input`` (a null input) or ``none``. The ring comes from
``TcpCollective.from_env`` (a folder), lent as a ``network`` block lends it. Prints one JSON line:
the hook's error message (or null), then the error of a later call on the ring, and when.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import silvic_net
from silvic_net import TcpCollective, _native

BLOCK = 16  # bytes per rank's block
Reducer = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int32
)


@Reducer
def add_bytes(src: int, dst: int, type_size: int, size: int) -> None:
    a = (ctypes.c_uint8 * size).from_address(dst)
    b = (ctypes.c_uint8 * size).from_address(src)
    for i in range(size):
        a[i] = (a[i] + b[i]) % 256


def main() -> None:
    hook, broken = sys.argv[1:3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mine = rank == int(os.environ["BROKEN_RANK"])
    native = ctypes.CDLL(_native.__file__)
    native.silvic_lgbm_allgather.restype = ctypes.c_void_p
    native.silvic_lgbm_reduce_scatter.restype = ctypes.c_void_p
    native.silvic_lgbm_free_message.argtypes = [ctypes.c_void_p]

    ring = TcpCollective.from_env(60.0)
    _native._lightgbm_lend(ring)
    try:
        count = world + 1 if mine and broken == "num_block" else world
        starts = (ctypes.c_int32 * count)(*[i * BLOCK for i in range(count)])
        lens = (ctypes.c_int32 * count)(*[BLOCK] * count)
        whole = (ctypes.c_uint8 * (world * BLOCK))(*[rank + 1] * (world * BLOCK))
        output = (ctypes.c_uint8 * (world * BLOCK))()
        out_ptr = None if mine and broken == "output" else output
        if hook == "allgather":
            block = (ctypes.c_uint8 * BLOCK)(*[rank + 1] * BLOCK)
            in_ptr = None if mine and broken == "input" else block
            message = native.silvic_lgbm_allgather(
                in_ptr, BLOCK, starts, lens, count, out_ptr, world * BLOCK
            )
        else:
            in_ptr = None if mine and broken == "input" else whole
            message = native.silvic_lgbm_reduce_scatter(
                in_ptr, world * BLOCK, 1, starts, lens, count, out_ptr, world * BLOCK, add_bytes
            )
        error = None
        if message:
            error = ctypes.string_at(message).decode()
            native.silvic_lgbm_free_message(message)
    finally:
        _native._lightgbm_return(ring)
    try:
        ring.allgather_bytes(b"after")
        later = None
    except silvic_net.CollectiveError as e:
        later = str(e)
    print(json.dumps({"error": error, "later": later, "at": time.time()}), flush=True)


if __name__ == "__main__":
    main()
