"""Ctrl-C during a call that waits: a real Python process sent SIGINT. Rings of 3 processes
(tests/interrupt_rank.py), one of which keeps the others waiting: rank 2 never starts (the
start), or enters its allreduce or its LightGBM training seconds late (a collective, a
LightGBM network hook). SIGINT to rank 0 while it waits
must raise KeyboardInterrupt there within a second, end the process non-zero, and fail every
other rank well within its timeout, naming rank 0. Every process is bounded in time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

import pytest

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interrupt_rank.py")
WORLD = 3
TIMEOUT = 60.0  # each rank's own: the test must end far sooner
LIMIT = 45.0  # past this a rank is killed and the test fails


class Rank:
    """A rank process whose stdout lines are kept, each with the time it said it."""

    def __init__(self, rank: int, mode: str, env: dict[str, str]) -> None:
        self.rank = rank
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, RANK_SCRIPT, mode],
            env={**env, "SILVIC_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def said(self, word: str, within: float) -> Optional[str]:
        """The first line starting with ``word``, waiting up to ``within`` seconds."""
        until = time.monotonic() + within
        while time.monotonic() < until:
            for line in list(self.lines):
                if line.startswith(word):
                    return line
            if self.process.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.01)
        return next((line for line in self.lines if line.startswith(word)), None)

    def finish(self, within: float) -> int:
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"rank {self.rank} did not end: {self.lines}") from None


def at(line: str) -> float:
    return float(line.rsplit("at=", 1)[1])


def start_ring(mode: str, ranks: list[int], late: float = 0.0) -> list[Rank]:
    with socket.socket() as s:  # a port nothing listens on once it closes: rank 0 takes it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SILVIC_", "SLURM_"))},
        "SILVIC_WORLD_SIZE": str(WORLD),
        "SILVIC_RENDEZVOUS": f"tcp://127.0.0.1:{port}",
        "SILVIC_JOB_TOKEN": "interrupt-test-token-9f3b2c71d0",
        "TIMEOUT": str(TIMEOUT),
        "LATE_RANK": "2",
        "LATE_SECONDS": str(late),
    }
    return [Rank(r, mode, env) for r in ranks]


def interrupt(rank0: Rank, waiting_word: str) -> float:
    """Sends SIGINT to rank 0 half a second after it says ``waiting_word``; returns when."""
    line = rank0.said(waiting_word, LIMIT)
    assert line is not None, f"rank 0 never said {waiting_word}: {rank0.lines}"
    time.sleep(0.5)  # well inside the wait
    sent = time.time()
    rank0.process.send_signal(signal.SIGINT)
    return sent


def assert_interrupted(rank0: Rank, sent: float) -> None:
    line = rank0.said("INTERRUPTED", 5.0)
    assert line is not None, f"no KeyboardInterrupt: {rank0.lines}"
    assert at(line) - sent < 1.0, f"KeyboardInterrupt {at(line) - sent:.2f} s after SIGINT"
    assert rank0.finish(5.0) != 0


# How each mode's other ranks name rank 0 in their failure: the collective's CollectiveError by
# its fields, LightGBM's error by its text.
NAMES_RANK_0 = {
    "collective": lambda line: "origin=0" in line or "peer=0" in line,
    "lightgbm": lambda line: "LightGBMError" in line and "rank 0" in line,
}


@pytest.mark.parametrize("mode", ["collective", "lightgbm"])
def test_sigint_interrupts_a_rank_waiting_in_a_call_and_fails_the_others_naming_it(mode: str) -> None:
    ranks = start_ring(mode, [0, 1, 2], late=8.0)
    try:
        for r in ranks:
            assert r.said("CONNECTED", LIMIT) is not None, f"rank {r.rank}: {r.lines}"
        sent = interrupt(ranks[0], "CALLING")
        assert_interrupted(ranks[0], sent)
        # Rank 1 waits in the same call (an allreduce, or LightGBM's hook): it hears rank 0's
        # abort at once. Rank 2, late, may still find every frame of that first call already
        # sent to it (the others' data goes out before their abort), and then fails at its next
        # call.
        for r in ranks[1:]:
            line = r.said("FAILED", LIMIT)
            assert line is not None, f"rank {r.rank}: {r.lines}"
            assert NAMES_RANK_0[mode](line), line
            assert r.finish(5.0) == 3
        failed_1 = ranks[1].said("FAILED", 0)
        assert failed_1 is not None and "cancelled" in failed_1, failed_1
        assert at(failed_1) - sent < 5.0, failed_1
    finally:
        for r in ranks:
            r.process.kill()


def test_sigint_interrupts_from_env_waiting_on_a_rank_that_never_starts() -> None:
    ranks = start_ring("start", [0, 1])  # rank 2 never starts
    try:
        sent = interrupt(ranks[0], "STARTING")
        assert_interrupted(ranks[0], sent)
        # Rank 1 is told rank 0 gave the exchange up, and why.
        line = ranks[1].said("FAILED", LIMIT)
        assert line is not None, ranks[1].lines
        assert "cancelled" in line and "rank 0" in line, line
        assert at(line) - sent < 5.0, line
        assert ranks[1].finish(5.0) == 3
    finally:
        for r in ranks:
            r.process.kill()
