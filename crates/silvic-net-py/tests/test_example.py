"""examples/ray_allreduce.py, the README's example, runs and prints what it promises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ray_allreduce.py"


def test_ray_allreduce_example_runs() -> None:
    pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="svex-")  # Ray's session files; a short path, removed after
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": temp,
    }
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=150
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ring of 4 actors: 127.0.0.1:"), done.stdout
    for rank in range(4):
        assert any(
            line.startswith(f"rank {rank}: summed histogram (8, 32, 2)")
            and "matches the driver's sum: True" in line
            for line in lines
        ), done.stdout
    assert "every rank holds the same bits: True" in lines, done.stdout
