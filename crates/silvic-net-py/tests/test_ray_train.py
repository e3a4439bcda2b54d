"""silvic_net.ray.train on a real local Ray cluster: Ray Train v2 trainers of 4 workers.

Each train loop (train_loops.py) writes what every rank saw to files under tmp_path; the tests
read them. Times between events come from those records (wall clock, one machine).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402

from silvic_net.ray.train import (  # noqa: E402
    HangReport,
    PlacementCheck,
    RingHangError,
    SilvicConfig,
)

WORLD = 4


def fit(
    loop: Callable[[dict[str, Any]], None],
    config: dict[str, Any],
    tmp_path: Path,
    *,
    backend: SilvicConfig,
    max_failures: int = 0,
    callbacks: Sequence[Any] = (),
) -> Any:
    trainer = DataParallelTrainer(
        loop,
        train_loop_config={**config, "out": str(tmp_path)},
        backend_config=backend,
        scaling_config=ScalingConfig(num_workers=WORLD),
        run_config=RunConfig(
            name=tmp_path.name,
            storage_path=str(tmp_path / "storage"),
            failure_config=FailureConfig(max_failures=max_failures),
            # Every trainer here checks its placement: a group that fits is never refused.
            callbacks=[PlacementCheck(), *callbacks],
        ),
    )
    return trainer.fit()


def events(tmp_path: Path, rank: int, kind: Optional[str] = None) -> list[dict[str, Any]]:
    lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
    every = [json.loads(line) for line in lines]
    return [e for e in every if kind is None or e.get("event") == kind]


def test_config_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="interface or listen_host, not both"):
        SilvicConfig(interface="lo", listen_host="0.0.0.0")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        SilvicConfig(timeout=0)
    with pytest.raises(ValueError, match="fail_after .* must be at least report_after"):
        HangReport(report_after=10.0, fail_after=5.0)
    from silvic_net.ray.train import get_ring

    with pytest.raises(RuntimeError, match="backend_config=silvic_net.ray.train.SilvicConfig"):
        get_ring()  # this process is no worker of such a trainer


def test_four_workers_form_one_ring_in_world_rank_order(ray_cluster: Any, tmp_path: Path) -> None:
    from train_loops import collectives

    result = fit(
        collectives,
        {"seed": 11, "iterations": 120},
        tmp_path,
        backend=SilvicConfig(timeout=60.0, collective_timeout=45.0, listen_host="0.0.0.0"),
    )
    assert result.error is None
    digests, node_ips = set(), set()
    for rank in range(WORLD):
        where, done = events(tmp_path, rank)
        assert where["world_rank"] == rank and where["world"] == where["world_size"] == WORLD
        assert where["timeout"] == 45.0
        assert done["rank"] == rank and done["checked"] >= 120, done
        digests.add(done["digest"])
        node_ips.add(where["node_ip"])
    assert len(digests) == 1, "inexact sums differ between ranks"
    # One node here; on test_ray_train_hosts.py's cluster, workers on every node.
    nodes = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert node_ips == nodes, (node_ips, nodes)


@pytest.mark.timeout(240)
def test_a_killed_worker_fails_the_others_fast_and_the_run_resumes_from_its_checkpoint(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from train_loops import steps

    victim, kill_at, total_steps = 2, 3, 6
    result = fit(
        steps,
        {"steps": total_steps, "kill_at": kill_at, "victim": victim},
        tmp_path,
        # A long collective timeout: the survivors must learn of the death from the sockets.
        backend=SilvicConfig(timeout=60.0, collective_timeout=300.0),
        max_failures=2,
    )
    ended = time.time()
    assert result.error is None
    assert result.metrics["step"] == total_steps - 1
    killed = json.loads((tmp_path / "killed").read_text())
    assert (killed["rank"], killed["step"]) == (victim, kill_at)

    failures, restarts = [], []
    for rank in range(WORLD):
        starts = events(tmp_path, rank, "start")
        assert len(starts) >= 2, f"rank {rank} started once: {starts}"
        first, last = starts[0], starts[-1]
        assert first["step"] == 0 and first["ring_rank"] == last["ring_rank"] == rank
        # The new group's processes resume from a checkpoint: past step 0, not past the kill.
        assert 1 <= last["step"] <= kill_at, starts
        assert last["pid"] != first["pid"], "the restart reused a process"
        # The same checkpoint on every rank, and the same sum as a run without a failure.
        assert last["step"] == events(tmp_path, 0, "start")[-1]["step"]
        (end,) = events(tmp_path, rank, "end")
        assert end["total"] == sum(WORLD * (s + 1) for s in range(total_steps))
        restarted = last["at"] - killed["at"]
        restarts.append(f"rank {rank}: restarted at step {last['step']} {restarted:.1f} s after the kill")
        if rank == victim:
            continue
        # Every survivor's collective raised, naming the dead rank, long before its timeout.
        (error,) = events(tmp_path, rank, "error")
        assert error["step"] == kill_at and error["peer"] == victim, error
        assert f"rank {victim}" in error["message"], error
        latency = error["at"] - killed["at"]
        assert latency < 10.0, f"rank {rank} failed {latency:.1f} s after the kill: {error}"
        failures.append(
            f"rank {rank}: {error['kind']} {latency * 1000:.0f} ms after the kill: {error['message']}"
        )
    ran = f"run ended {ended - killed['at']:.1f} s after the kill"
    print("\n" + "\n".join(failures + restarts + [ran]))


@pytest.mark.timeout(180)
def test_a_worker_that_stops_calling_is_named_by_the_hang_report(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from train_loops import straggler

    victim, stop_at = 1, 20
    with pytest.raises(RingHangError) as raised:
        fit(
            straggler,
            {"steps": 40, "stop_at": stop_at, "victim": victim, "sleep": 90.0},
            tmp_path,
            # The ring's own timeout is far away: the report must come first. fail_after is
            # well above how late one worker's train loop may start after another's.
            backend=SilvicConfig(timeout=60.0, collective_timeout=300.0),
            callbacks=[HangReport(report_after=3.0, fail_after=8.0)],
        )
    failed = time.time()
    error = raised.value
    assert error.waited_on == [victim]
    lines = error.report.splitlines()
    assert lines[0].startswith(
        f"silvic-net hang report: 3 of 4 ranks have waited up to "
    ) and lines[0].endswith(f"in allgather_bytes #{stop_at} on rank {victim}, which has not reached it")
    for rank in range(WORLD):
        line = next(l for l in lines if l.startswith(f"  rank {rank}: "))
        if rank == victim:
            assert "not in a collective for" in line and f"the last #{stop_at - 1}" in line, line
            assert "train_loops.py" in line and "in straggler" in line, line
        else:
            assert f"in allgather_bytes #{stop_at} for" in line, line
    assert "failing the attempt: it waited past fail_after=8 s" in error.report
    (stopped,) = events(tmp_path, victim, "stopped")
    print(f"\nfailed {failed - stopped['at']:.1f} s after rank {victim} stopped calling:\n{error.report}")


def test_lightgbm_on_four_workers_grows_one_model_from_every_shard(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """examples/ray_train_lightgbm.py's train loop: real LightGBM, data-parallel, over the ring."""
    lgb = pytest.importorskip("lightgbm")
    from ray.train.lightgbm import RayTrainReportCallback
    from train_loops import lightgbm_example, load_example

    rows, rounds = 4000, 10
    config = {"seed": 3, "rows": rows, "rounds": rounds}
    result = fit(lightgbm_example, config, tmp_path, backend=SilvicConfig(timeout=60.0))
    assert result.error is None
    models = [(tmp_path / f"model{rank}.txt").read_text() for rank in range(WORLD)]
    # The shards differ (seeded by rank): only trees grown from histograms summed over the ring
    # come out the same on every worker.
    for rank in range(1, WORLD):
        assert models[rank] == models[0], f"rank {rank}'s model differs from rank 0's"
    trees = lgb.Booster(model_str=models[0]).dump_model()["tree_info"]
    assert len(trees) == rounds
    assert all(tree["num_leaves"] > 1 for tree in trees), "a tree without a split"
    # Every tree's root counts the rows of all four shards, not one worker's.
    assert {tree["tree_structure"]["internal_count"] for tree in trees} == {WORLD * rows}

    metrics = result.metrics
    assert metrics["trees"] == rounds and metrics["workers_with_rank0_model"] == WORLD, metrics
    rmse = metrics["valid_rmse_all_workers"]
    example = load_example("ray_train_lightgbm")
    labels = np.concatenate(
        [example.make_shard(3 * 1000 + 500 + rank, rows // 5)[1] for rank in range(WORLD)]
    )
    # Finite, and better than predicting the mean: the trees learned.
    assert math.isfinite(rmse) and rmse < float(np.std(labels)), (rmse, np.std(labels))
    saved = RayTrainReportCallback.get_model(result.checkpoint)
    assert saved.dump_model()["tree_info"] == trees, "the checkpoint is not rank 0's model"
    print(f"\n{len(trees)} trees, the same on {WORLD} workers; validation RMSE {rmse:.4f}")


def progress(entered: int, index: Optional[int] = None, in_call: float = 0.0) -> dict[str, Any]:
    """A RingWatch.progress() answer, as a worker gives it to the hang report."""
    return {
        "entered": entered,
        "completed": entered - (index is not None),
        "index": index,
        "op": "allreduce_sum_f64" if index is not None else None,
        "in_call": in_call if index is not None else None,
        "since_return": 1.0,
        "failed": False,
    }


def test_diagnose_names_who_is_behind_or_silent_and_no_one_when_all_wait_alike() -> None:
    from silvic_net.ray.hang import diagnose

    # Short waits are no hang.
    assert diagnose({0: progress(8, 7, 2.0), 1: progress(7)}, 3.0, 10.0) is None
    # Rank 1 is two calls behind, rank 3 does not answer: both are named.
    hang = diagnose(
        {0: progress(8, 7, 5.0), 1: progress(6), 2: progress(8, 7, 4.0), 3: None}, 3.0, 10.0
    )
    assert hang is not None
    assert (hang.index, hang.op, hang.waited) == (7, "allreduce_sum_f64", 5.0)
    assert (hang.waiting, hang.waited_on) == ([0, 2], [1, 3])
    assert "on ranks 1, 3, which have not reached it" in hang.text.splitlines()[0]
    assert "  rank 3: did not answer the poll within 10 s" in hang.text.splitlines()
    # Every rank in the same call: the ring is stalled between ranks, and no rank is blamed.
    hang = diagnose({r: progress(8, 7, 5.0) for r in range(3)}, 3.0, 10.0)
    assert hang is not None and hang.waited_on == [] and hang.waiting == [0, 1, 2]
    assert "none is behind" in hang.text


V1_DRIVER = """
import json, sys, tempfile
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.data_parallel_trainer import DataParallelTrainer  # Train v1's
from silvic_net.ray.train import SilvicConfig
from train_loops import collectives

out = sys.argv[1]
ray.init(num_cpus=5, include_dashboard=False, log_to_driver=False,
         _temp_dir=tempfile.mkdtemp(prefix="svray1-"))  # v1's trainer actor takes a CPU
result = DataParallelTrainer(
    collectives,
    train_loop_config={"seed": 5, "iterations": 40, "out": out},
    backend_config=SilvicConfig(timeout=60.0),
    scaling_config=ScalingConfig(num_workers=4),
    run_config=RunConfig(name="v1", storage_path=out + "/storage"),
).fit()
print(json.dumps({"error": None if result.error is None else str(result.error)}))
"""


@pytest.mark.timeout(150)
def test_a_train_v1_trainer_forms_the_same_ring(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    env = {
        **os.environ,
        "RAY_TRAIN_V2_ENABLED": "0",  # read when ray.train is imported: a process of its own
        "PYTHONPATH": os.pathsep.join(p for p in [tests, os.environ.get("PYTHONPATH")] if p),
    }
    env.pop("SILVIC_RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", V1_DRIVER, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=140,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"error": None}
    digests = set()
    for rank in range(WORLD):
        where, finished = events(tmp_path, rank)
        assert where["world_rank"] == rank and where["world"] == WORLD
        assert finished["rank"] == rank and finished["checked"] >= 40, finished
        digests.add(finished["digest"])
    assert len(digests) == 1


# A driver of its own (this session's Ray declares 4 CPUs): Ray with 2 CPUs, a trainer of 4
# workers asking 1 CPU each. It prints what fit() raised, how soon, and the PlacementError.
_UNPLACEABLE = """
import sys, time
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from silvic_net.ray import PlacementError
from silvic_net.ray.train import PlacementCheck, SilvicConfig

def loop(config):
    pass

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         _temp_dir=sys.argv[1])
trainer = DataParallelTrainer(
    loop,
    backend_config=SilvicConfig(timeout=600.0),
    scaling_config=ScalingConfig(num_workers=4),
    run_config=RunConfig(storage_path=sys.argv[2], callbacks=[PlacementCheck()]),
)
started = time.monotonic()
try:
    trainer.fit()
    print("FITTED")
except Exception as e:
    took = time.monotonic() - started
    cause = e
    while cause is not None and not isinstance(cause, PlacementError):
        cause = getattr(cause, "controller_failure", None) or cause.__cause__
    print(f"RAISED {type(e).__name__} after {took:.1f} s")
    if cause is not None:
        print(f"PLACEMENT ranks={cause.ranks} asked={cause.asked} cluster={cause.cluster}")
    print(f"MESSAGE {e}")
"""


def test_a_trainer_whose_workers_cannot_all_be_placed_fails_within_30s(tmp_path: Path) -> None:
    from own_ray import run_own_ray

    script = tmp_path / "unplaceable.py"
    script.write_text(_UNPLACEABLE)
    out = run_own_ray(script, [str(tmp_path / "storage")], timeout=150)
    took = float(out.split("after ")[1].split(" s")[0])
    assert took < 30.0, out
    # The PlacementError itself reaches the driver (inside Ray Train's ControllerError).
    assert "PLACEMENT ranks=[2, 3] asked={'CPU': 4.0} cluster={" in out, out
    assert "'CPU': 2.0" in out.split("cluster=")[1], out
    message = out.split("MESSAGE ")[1]
    assert "Ray cannot place 2 of the trainer's 4 workers: each asks for 1 CPU" in message, message
    assert "4 CPU in all, and the cluster has 2" in message, message
    assert "only 2 fit" in message, message


def test_the_placement_check_counts_whole_workers_per_node_by_strategy() -> None:
    from silvic_net.ray.train import _workers_that_fit

    nodes = [{"CPU": 3.0, "GPU": 1.0, "memory": 8e9}, {"CPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}]
    assert _workers_that_fit({"CPU": 1.0}, nodes, "PACK") == 13
    assert _workers_that_fit({"CPU": 2.0}, nodes, "SPREAD") == 1 + 1 + 4
    # A worker asking for a GPU fits only where there is one, as many as the GPUs and CPUs allow.
    assert _workers_that_fit({"CPU": 2.0, "GPU": 1.0}, nodes, "PACK") == 1 + 0 + 2
    assert _workers_that_fit({"CPU": 1.0}, nodes, "STRICT_PACK") == 8
    assert _workers_that_fit({"CPU": 1.0}, nodes, "STRICT_SPREAD") == 3
    assert _workers_that_fit({"CPU": 0.5}, [{"CPU": 2.0}], "PACK") == 4
    assert _workers_that_fit({"CPU": 1.0}, [], "PACK") == 0
