"""Gradient histograms that do not change with the world size: fixed-point sums over a ring.

Each rank bins its share of the rows' gradients into a FixedHistogram at a scale every rank
agrees on, one exact allreduce sums them, and every rank reads the same float64 sums. The same
rows dealt out to 1, 2, 3 or 4 ranks give the same bits; a plain float64 histogram summed with
``allreduce_sum_f64`` usually does not.

    # silvic-net is not on PyPI: build its wheel from a clone of this repository (needs a Rust
    # toolchain), then install it into a venv
    python3 -m venv .venv && . .venv/bin/activate && pip install maturin numpy
    (cd crates/silvic-net-py && maturin build --release -o ../../target/wheels)
    pip install target/wheels/silvic_net-*.whl
    python examples/fixed_histogram.py

The ranks here are threads of one process on 127.0.0.1 (a rank releases the GIL while it
waits); on a cluster each is a process of its own, formed as in examples/ray_allreduce.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from silvic_net import FixedHistogram, FixedScale, TcpCollective

ROWS, BINS = 200_000, 4096


def rank_histogram(
    ring: TcpCollective, bins: npt.NDArray[np.int64], grads: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """This rank's rows summed over the ring: fixed-point, and plain float64 for comparison."""
    max_abs = float(np.abs(grads).max(initial=0.0))
    scale = FixedScale.agree(ring, max_abs, len(grads))
    hist = FixedHistogram(BINS, scale)
    hist.add(bins, grads)
    hist.allreduce(ring)
    plain = np.bincount(bins, weights=grads, minlength=BINS).astype(np.float64)
    ring.allreduce_sum_f64(plain)
    return hist.to_f64(), plain


def run_world(
    world: int, bins: npt.NDArray[np.int64], grads: npt.NDArray[np.float64], seed: int
) -> list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """Deals the rows out to `world` ranks at random and runs every rank on its own thread."""
    owner = np.random.default_rng(seed).integers(0, world, size=len(grads))
    listeners = [TcpCollective.bind("127.0.0.1") for _ in range(world)]
    addresses = [listener.address() for listener in listeners]

    def rank(r: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        ring = TcpCollective.connect(listeners[r], r, addresses, "example-token", timeout=60.0)
        mine = owner == r
        return rank_histogram(ring, bins[mine], grads[mine])

    with ThreadPoolExecutor(max_workers=world) as pool:
        return list(pool.map(rank, range(world)))


def main() -> None:
    rng = np.random.default_rng(37)
    bins = rng.integers(0, BINS, size=ROWS)
    # Heavy-tailed gradients of either sign: magnitudes from 2^-30 to 2^10.
    grads = rng.choice([-1.0, 1.0], size=ROWS) * np.exp2(rng.uniform(-30, 10, size=ROWS))
    alone_fixed, alone_plain = run_world(1, bins, grads, seed=0)[0]
    for world in (2, 3, 4):
        results = run_world(world, bins, grads, seed=world)
        fixed_same = all(np.array_equal(f.view(np.uint64), alone_fixed.view(np.uint64)) for f, _ in results)
        plain_same = all(np.array_equal(p.view(np.uint64), alone_plain.view(np.uint64)) for _, p in results)
        print(f"world {world}: fixed-point bits equal the one-rank run's: {fixed_same}; "
              f"float64 bits: {plain_same}")


if __name__ == "__main__":
    main()
