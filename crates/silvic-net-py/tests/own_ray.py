"""A script that starts a Ray cluster of its own, run in a child process: for the tests that need
a cluster other than conftest's (fewer CPUs than the actors ask for), so that its Ray never meets
the session's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run_own_ray(script: Path, args: list[str], timeout: float) -> str:
    """Runs ``script`` with ``python script TEMP *args``, where TEMP is a fresh folder for Ray's
    files (short: Ray's socket paths must fit 107 bytes), removed afterwards; returns its stdout
    and fails the test, with its stderr's tail, if the script printed no ``RAISED`` line."""
    temp = tempfile.mkdtemp(prefix="svray-own-")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    try:
        done = subprocess.run(
            [sys.executable, str(script), temp, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert "RAISED" in done.stdout, f"stdout: {done.stdout}\nstderr: {done.stderr[-3000:]}"
    return done.stdout
