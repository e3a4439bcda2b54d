"""Four Ray actors build gradient histograms of their own rows and sum them over a silvic-net ring.

This is the step distributed gradient boosting repeats for every tree node: each rank bins its
shard's gradients and hessians per (feature, bin), one allreduce sums the histograms, and every
rank then holds the histogram of all the data. A small allgather shares a fixed-size record.

    # silvic-net is not on PyPI: build its wheel from a clone of this repository (needs a Rust
    # toolchain), then install it with Ray into a venv
    python3 -m venv .venv && . .venv/bin/activate && pip install maturin
    (cd crates/silvic-net-py && maturin build --release -o ../../target/wheels)
    pip install target/wheels/silvic_net-*.whl ray
    python examples/ray_allreduce.py

It starts a local Ray cluster and prints what each actor got.
"""

from __future__ import annotations

import os
import struct

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402
import ray  # noqa: E402

from silvic_net.ray import RingMember, form_ring  # noqa: E402

WORLD = 4
FEATURES, BINS = 8, 32
RECORD = "<qqd"  # rank, rows, local gradient sum: the same size on every rank


@ray.remote(num_cpus=1)
class HistogramWorker(RingMember):
    def __init__(self, seed: int, rows: int) -> None:
        rng = np.random.default_rng(seed)
        self.bins = rng.integers(0, BINS, size=(rows, FEATURES))  # pre-binned features
        self.grad = rng.standard_normal(rows)
        self.hess = rng.uniform(0.5, 1.0, rows)

    def local_histogram(self) -> np.ndarray:
        """(feature, bin, [grad, hess]) sums over this actor's rows."""
        hist = np.zeros((FEATURES, BINS, 2))
        for f in range(FEATURES):
            hist[f, :, 0] = np.bincount(self.bins[:, f], weights=self.grad, minlength=BINS)
            hist[f, :, 1] = np.bincount(self.bins[:, f], weights=self.hess, minlength=BINS)
        return hist

    def step(self) -> tuple[int, np.ndarray, list[tuple[int, int, float]]]:
        hist = self.local_histogram()
        self.ring.allreduce_sum_f64(hist.reshape(-1))  # a view of hist: summed in place
        record = struct.pack(RECORD, self.ring.rank, len(self.grad), float(self.grad.sum()))
        records = [struct.unpack(RECORD, r) for r in self.ring.allgather_bytes(record)]
        return self.ring.rank, hist, records


def main() -> None:
    ray.init(num_cpus=WORLD, include_dashboard=False)
    try:
        workers = [
            HistogramWorker.remote(seed=rank, rows=10_000 + 1_000 * rank) for rank in range(WORLD)
        ]
        addresses = form_ring(workers, timeout=60.0)  # bind, gather, connect: one call
        print(f"ring of {WORLD} actors: {' -> '.join(addresses)}")

        results = ray.get([w.step.remote() for w in workers], timeout=120)
        local = ray.get([w.local_histogram.remote() for w in workers], timeout=120)
        expected = np.sum(local, axis=0)  # what the allreduce must give, summed here instead
        for rank, hist, records in results:
            same = bool(np.allclose(hist, expected))
            print(
                f"rank {rank}: summed histogram {hist.shape}, hessian total "
                f"{hist[0, :, 1].sum():.3f}, matches the driver's sum: {same}; gathered {records}"
            )
            assert same and records == results[0][2]
        bitwise = all(np.array_equal(hist, results[0][1]) for _, hist, _ in results)
        print(f"every rank holds the same bits: {bitwise}")
        assert bitwise
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
