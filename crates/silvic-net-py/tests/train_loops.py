"""Train loops for test_ray_train.py, in a module of their own so Ray Train workers import them
by name. Each loop writes what it saw to files under ``config["out"]`` (the test's tmp_path, on
this machine's one filesystem), one JSON line per event, so the test reads every rank's view."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
from ray.train import Checkpoint

from silvic_net import CollectiveError
from silvic_net.ray.train import get_ring
from ray_actors import describe, mixed


def record(config: dict[str, Any], rank: int, event: dict[str, Any]) -> None:
    with open(Path(config["out"]) / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps({"at": time.time(), "pid": os.getpid(), **event}) + "\n")


def collectives(config: dict[str, Any]) -> None:
    """Many checked collectives of several lengths, as the bare-actor test runs them."""
    ring = get_ring()
    context = ray.train.get_context()
    record(
        config,
        ring.rank,
        {"world_rank": context.get_world_rank(), "world": ring.world_size,
         "world_size": context.get_world_size(), "timeout": ring.timeout,
         "node_ip": ray.util.get_node_ip_address()},
    )
    result = mixed(ring, config["seed"], config["iterations"])
    record(config, ring.rank, result)
    ray.train.report({"checked": result["checked"]})


def steps(config: dict[str, Any]) -> None:
    """``config["steps"]`` steps of one allreduce each, a checkpoint after every step; resumes
    from the last checkpoint. On its first attempt, rank ``config["victim"]`` kills its own
    process (SIGKILL, as the OOM killer would) at step ``config["kill_at"]``."""
    ring = get_ring()
    rank, world = ring.rank, ring.world_size
    checkpoint = ray.train.get_checkpoint()
    start, total = 0, 0.0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = json.loads((Path(folder) / "state.json").read_text())
        start, total = state["step"] + 1, state["total"]
    record(config, rank, {"event": "start", "step": start, "ring_rank": rank})
    marker = Path(config["out"]) / "killed"
    for step in range(start, config["steps"]):
        if rank == config["victim"] and step == config["kill_at"] and not marker.exists():
            marker.write_text(json.dumps({"at": time.time(), "rank": rank, "step": step}))
            os.kill(os.getpid(), signal.SIGKILL)
        buf = np.full(1 << 16, float(step + 1))  # 512 KiB: the ring's reduce-scatter path
        buf[rank] += rank
        try:
            ring.allreduce_sum_f64(buf)
        except CollectiveError as e:
            record(config, rank, {"event": "error", "step": step, **describe(e)})
            raise
        expected = np.full(1 << 16, world * float(step + 1))
        expected[:world] += np.arange(world)
        np.testing.assert_array_equal(buf, expected)
        total += buf[-1]
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if rank == 0:
                (Path(folder) / "state.json").write_text(json.dumps({"step": step, "total": total}))
                saved = Checkpoint.from_directory(folder)
            ray.train.report({"step": step, "total": total}, checkpoint=saved)
    record(config, rank, {"event": "end", "total": total})


def straggler(config: dict[str, Any]) -> None:
    """Collectives back to back; at step ``config["stop_at"]`` rank ``config["victim"]`` stops
    calling (it sleeps, bounded) while the others wait for it."""
    ring = get_ring()
    record(config, ring.rank, {"event": "start"})
    for step in range(config["steps"]):
        if ring.rank == config["victim"] and step == config["stop_at"]:
            record(config, ring.rank, {"event": "stopped", "step": step})
            time.sleep(config["sleep"])
        ring.allgather_bytes(step.to_bytes(4, "little"))
    ray.train.report({"steps": config["steps"]})


def lightgbm_example(config: dict[str, Any]) -> None:
    """The train loop of examples/ray_train_lightgbm.py, run as it is; then each worker writes
    the model it ended with to ``config["out"]``."""
    booster = load_example("ray_train_lightgbm").train_loop(config)
    rank = ray.train.get_context().get_world_rank()
    (Path(config["out"]) / f"model{rank}.txt").write_text(booster.model_to_string())


def load_example(name: str) -> Any:
    """examples/NAME.py of this repository, imported from its file (examples/ is no package)."""
    path = Path(__file__).resolve().parents[3] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
