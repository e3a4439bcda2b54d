"""A real local Ray cluster for the tests that need one, started once per session.

Run the tests on the installed wheel, from the repository root (crates/silvic-net-py/README.md):

    pip install -r crates/silvic-net-py/requirements-ci.txt
    (cd crates/silvic-net-py && maturin build --release -o ../../target/wheels)
    pip install --force-reinstall --no-deps target/wheels/silvic_net-*.whl
    (cd crates/silvic-net-py && python -m pytest tests)

Ray reads these variables when it starts; they are set before ``ray`` is imported anywhere.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # actors report 127.0.0.1
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """Ray on this machine: 4 CPUs declared, so 4 one-CPU actors fit on any core count.

    With ``SILVIC_RAY_ADDRESS`` set, the tests join that running cluster instead (the
    multi-node cluster of test_ray_train_hosts.py, whose nodes were started with this folder on
    their ``PYTHONPATH``) and leave it running.
    """
    ray = pytest.importorskip("ray")
    address = os.environ.get("SILVIC_RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    # Workers start from the raylet this process spawns and inherit its environment: this lets
    # them import the actor classes of ray_actors.py by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [TESTS, os.environ.get("PYTHONPATH")] if p
    )
    temp = tempfile.mkdtemp(prefix="svray-")  # short: Ray's socket paths must fit 107 bytes
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        _temp_dir=temp,
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
