"""LightGBM on Ray Train over silvic-net: four workers grow one model, data-parallel.

The train loop is the one of Ray's LightGBMTrainer examples (``lgb.train`` with a validation
set, ``ray.train.lightgbm.RayTrainReportCallback`` reporting the metrics after every round, and
the model saved from rank 0 as the run's checkpoint), with one change: LightGBM's
network is the silvic-net ring of ``silvic_net.ray.train.SilvicConfig``, entered with
``silvic_net.lightgbm.network(get_ring())``, in place of the ``machines`` and
``local_listen_port`` parameters of ``ray.train.lightgbm.get_network_params()``.

    # silvic-net is not on PyPI: build its wheel from a clone of this repository (needs a Rust
    # toolchain), then install it with Ray Train and LightGBM into a venv
    python3 -m venv .venv && . .venv/bin/activate && pip install maturin
    (cd crates/silvic-net-py && maturin build --release -o ../../target/wheels)
    pip install target/wheels/silvic_net-*.whl 'ray[train]' lightgbm
    python examples/ray_train_lightgbm.py

It starts a local Ray cluster, trains, and prints the run's metrics, the checkpoint and what the
model in it predicts. Each worker makes its own shard of one synthetic regression problem,
seeded by its rank; the trees are grown from all four shards' histograms, summed over the ring,
so every worker ends with the same model. It takes a minute or two: under Ray Train v2 each
round's report waits for the controller's next poll, about 2 s (docs/ray-train.md).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import lightgbm as lgb  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train import Checkpoint, RunConfig, ScalingConfig  # noqa: E402
from ray.train.lightgbm import RayTrainReportCallback  # noqa: E402
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402

import silvic_net.lightgbm  # noqa: E402
from silvic_net.ray.train import SilvicConfig, get_ring  # noqa: E402

WORLD = 4
FEATURES = 10


def make_shard(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` rows of the problem every worker shares, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES))
    y = x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] * x[:, 3] + rng.normal(scale=0.1, size=rows)
    return x, y


def train_loop(config: dict[str, Any]) -> lgb.Booster:
    """One worker's part; returns its booster, for a caller that wraps this loop."""
    ring = get_ring()  # ring.rank is this worker's world rank
    x, y = make_shard(config["seed"] * 1000 + ring.rank, config["rows"])
    x_valid, y_valid = make_shard(config["seed"] * 1000 + 500 + ring.rank, config["rows"] // 5)
    params = {
        "objective": "regression",
        "metric": "l2",
        "learning_rate": 0.3,
        "num_leaves": 31,
        "tree_learner": "data",  # data-parallel: every worker's histograms summed over the ring
        "num_machines": ring.world_size,
        "pre_partition": True,  # each worker trains on its own rows
        "num_threads": config.get("threads", 1),
        "deterministic": True,
        "seed": config["seed"],
        "verbose": -1,
    }
    # The Datasets are built inside the block: with num_machines above 1, LightGBM finds its
    # feature bins over the network.
    with silvic_net.lightgbm.network(ring):
        train = lgb.Dataset(x, y, params=params)
        valid = lgb.Dataset(x_valid, y_valid, reference=train)
        booster = lgb.train(
            params,
            train,
            num_boost_round=config["rounds"],
            valid_sets=[valid],
            valid_names=["valid"],
            # Reports "valid-l2" (on this worker's own validation rows) after every round.
            callbacks=[RayTrainReportCallback(checkpoint_at_end=False)],
        )
    # The ring is handed back on exit: sum the squared errors of every worker's validation rows
    # for the RMSE of them all, and gather each worker's model digest to show they agree.
    errors = np.array([float(np.sum((booster.predict(x_valid) - y_valid) ** 2)), len(y_valid)])
    ring.allreduce_sum_f64(errors)
    digests = ring.allgather_bytes(hashlib.sha256(booster.model_to_string().encode()).digest())
    metrics = {
        "valid_rmse_all_workers": float(np.sqrt(errors[0] / errors[1])),
        "trees": booster.num_trees(),
        "workers_with_rank0_model": sum(d == digests[0] for d in digests),
    }
    # The run's result is its latest checkpoint and the metrics reported with it; every worker
    # reports, rank 0 alone with the model (the file RayTrainReportCallback.get_model reads).
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if ring.rank == 0:
            booster.save_model(os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME))
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)
    return booster


def main() -> None:
    ray.init(num_cpus=WORLD, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="silvic-lgbm-")
    try:
        trainer = DataParallelTrainer(
            train_loop,
            train_loop_config={"seed": 7, "rows": 20_000, "rounds": 30},
            backend_config=SilvicConfig(timeout=120.0),
            scaling_config=ScalingConfig(num_workers=WORLD),
            run_config=RunConfig(name="lightgbm", storage_path=storage),
        )
        started = time.monotonic()
        result = trainer.fit()
        metrics = result.metrics
        print(f"trainer.fit() returned in {time.monotonic() - started:.1f} s")
        print(f"trained on {WORLD} workers of 20,000 rows each: {metrics['trees']} trees")
        print(f"validation RMSE over every worker's rows: {metrics['valid_rmse_all_workers']:.4f}")
        print(f"workers holding rank 0's model: {metrics['workers_with_rank0_model']} of {WORLD}")
        print(f"checkpoint: {result.checkpoint.path}")
        model = RayTrainReportCallback.get_model(result.checkpoint)
        x, y = make_shard(seed=12345, rows=5)  # rows no worker saw
        for row, (predicted, actual) in enumerate(zip(model.predict(x), y)):
            print(f"  row {row}: predicted {predicted:+.3f}, actual {actual:+.3f}")
        assert metrics["workers_with_rank0_model"] == WORLD
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
