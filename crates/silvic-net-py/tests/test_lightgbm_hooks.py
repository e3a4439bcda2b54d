"""LightGBM's network hooks handed what LightGBM must never pass: too many blocks, a null output
or input. Each rank is a process (the hooks' ring is process-global), its ring from
``TcpCollective.from_env`` in a folder, and calls the hooks as LightGBM would
(tests/lightgbm_hooks_rank.py). The rank given bad arguments gets a clear error before a byte
moves; every other rank's call fails too, naming it, at once; and the ring stays closed on
every rank. Every process has a timeout; a hang fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from test_buffers import wait_until

WORLD = 3
BROKEN = 1
RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightgbm_hooks_rank.py")
LIMIT = 60.0


def run(tmp: Path, hook: str, broken: str) -> list[dict[str, Any]]:
    meet = tmp / f"meet-{hook}-{broken}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SILVIC_", "SLURM_"))},
        "WORLD_SIZE": str(WORLD),
        "BROKEN_RANK": str(BROKEN),
        "SILVIC_RENDEZVOUS": f"file://{meet}",
        "SILVIC_JOB_TOKEN": "lgbm-hooks-token-5d2c8e1f7a",
        "SILVIC_SOCKET_IFNAME": "lo",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, RANK_SCRIPT, hook, broken],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    done = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=LIMIT)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert p.returncode == 0 and lines, f"rank {r} (exit {p.returncode}):\n{out}\n{err}"
            done.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            p.kill()
    return done


@pytest.mark.parametrize("hook", ["allgather", "reduce_scatter"])
@pytest.mark.parametrize(
    "broken,told",
    [
        ("num_block", f"LightGBM passed {WORLD + 1} blocks to a ring of {WORLD} ranks"),
        ("output", "LightGBM passed a null output of"),
        ("input", "LightGBM passed a null input of"),
    ],
)
def test_bad_arguments_fail_the_call_on_every_rank_naming_the_rank_that_had_them(
    tmp_path: Path, hook: str, broken: str, told: str
) -> None:
    done = run(tmp_path, hook, broken)
    error = done[BROKEN]["error"]
    assert error is not None and error.startswith("silvic-net: invalid argument: "), error
    assert told in error, error
    for r, result in enumerate(done):
        assert result["error"] is not None, f"rank {r} went on: {result}"
        assert result["later"] is not None, f"rank {r}'s ring is still open: {result}"
        if r != BROKEN:
            assert f"rank {BROKEN} failed: invalid argument" in result["error"], result
    # The others heard at once, not after their timeout (60 s).
    finished = [result["at"] for result in done]
    assert max(finished) - min(finished) < 20.0, finished


def test_hooks_with_good_arguments_move_every_block(tmp_path: Path) -> None:
    for hook in ("allgather", "reduce_scatter"):
        for r, result in enumerate(run(tmp_path, hook, "none")):
            assert result["error"] is None and result["later"] is None, f"{hook} rank {r}: {result}"


def test_a_lent_ring_goes_back_only_to_its_lender_and_never_to_a_borrowed_object() -> None:
    import threading

    from silvic_net import TcpCollective, _native
    from test_binding import ring_of

    listener = TcpCollective.bind("127.0.0.1")
    lender = TcpCollective.connect(listener, 0, [listener.address()], "t" * 32, timeout=5.0)
    _native._lightgbm_lend(lender)
    try:
        # Another ring object is not the one lent: refused, and the ring stays lent.
        other_listener = TcpCollective.bind("127.0.0.1")
        other = TcpCollective.connect(
            other_listener, 0, [other_listener.address()], "t" * 32, timeout=5.0
        )
        with pytest.raises(RuntimeError, match="not the ring LightGBM's network was lent"):
            _native._lightgbm_return(other)
        assert repr(lender) == "TcpCollective(lent to LightGBM)"
        # An object in use on another thread cannot take a ring now: refused before the lent
        # ring leaves the slot (it used to be taken out, then dropped: closed).
        pair = ring_of(2)
        watch = pair[0].watch()
        in_use = threading.Thread(target=pair[0].allgather_bytes, args=(b"x",))
        in_use.start()
        # pair[0] waits on pair[1], borrowed meanwhile.
        wait_until(lambda: watch.progress()["index"] is not None, 10.0, "the call began")
        with pytest.raises(RuntimeError, match="borrowed"):
            _native._lightgbm_return(pair[0])
        pair[1].allgather_bytes(b"y")
        in_use.join(timeout=30)
    finally:
        _native._lightgbm_return(lender)
    assert lender.allgather_bytes(b"back") == [b"back"]


def test_lending_never_waits_with_the_gil_on_a_hook_that_holds_the_ring() -> None:
    # A hook holds the lent ring for a whole collective without the GIL; a second lend on
    # another thread is refused at once, where it used to wait for the hook with the GIL held,
    # freezing every Python thread (here: the one that would have let the hook finish).
    import ctypes
    import threading

    from silvic_net import TcpCollective, _native
    from test_binding import ring_of

    native = ctypes.CDLL(_native.__file__)
    native.silvic_lgbm_allgather.restype = ctypes.c_void_p
    native.silvic_lgbm_free_message.argtypes = [ctypes.c_void_p]
    rings = ring_of(2)
    rings[0].set_timeout(20.0)
    watch = rings[0].watch()
    _native._lightgbm_lend(rings[0])
    starts = (ctypes.c_int32 * 2)(0, 4)
    lens = (ctypes.c_int32 * 2)(4, 4)
    block = (ctypes.c_uint8 * 4)(1, 1, 1, 1)
    output = (ctypes.c_uint8 * 8)()
    message: list[int | None] = []
    hook = threading.Thread(
        target=lambda: message.append(
            native.silvic_lgbm_allgather(block, 4, starts, lens, 2, output, 8)
        )
    )
    try:
        hook.start()
        # The hook waits on rank 1, holding the ring.
        wait_until(lambda: watch.progress()["index"] is not None, 10.0, "the hook's call began")
        listener = TcpCollective.bind("127.0.0.1")
        second = TcpCollective.connect(listener, 0, [listener.address()], "t" * 32, timeout=5.0)
        asked = time.monotonic()
        with pytest.raises(RuntimeError, match="another ring is LightGBM's network"):
            _native._lightgbm_lend(second)
        assert time.monotonic() - asked < 5.0, "the lend waited for the hook"
        rings[1].allgather_blocks(bytes([2, 2, 2, 2]), [4, 4])
        hook.join(timeout=30)
    finally:
        _native._lightgbm_return(rings[0])
    assert message == [None], "the hook failed"
    assert list(output) == [1, 1, 1, 1, 2, 2, 2, 2]
