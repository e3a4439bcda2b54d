"""Fixed-point histograms from Python: the same bits for every world and partition, equal to
``math.fsum`` of the values as quantised; i128 allreduces of ``(n, 2)`` int64 arrays; errors on
every rank; Python and Rust ranks in one ring; and examples/fixed_histogram.py.

The Rust ranks are the silvic-net example ``fixed_histogram_rank``, built here with cargo.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, get_args

import numpy as np
import numpy.typing as npt
import pytest

from silvic_net import (
    CollectiveError,
    CollectiveErrorKind,
    FixedHistogram,
    FixedScale,
    TcpCollective,
)
from test_binding import on_every_rank, ring_of

ROOT = Path(__file__).resolve().parents[3]
BINS = 1024

Samples = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def samples(count: int, seed: int, n_bins: int = BINS) -> Samples:
    """Heavy-tailed values of either sign, 2^-30 to 2^10, one in a hundred far smaller (2^-80
    to 2^-47, below the window: rounded), each with a bin."""
    rng = np.random.default_rng(seed)
    powers = np.where(rng.random(count) < 0.01, rng.uniform(-80, -47, count), rng.uniform(-30, 10, count))
    values = rng.choice([-1.0, 1.0], size=count) * np.exp2(powers)
    return rng.integers(0, n_bins, size=count), values


def f32_samples(count: int, seed: int, n_bins: int) -> Samples:
    """Gradients as a trainer's float32s: either sign, 2^-20 to 1, each with a bin."""
    rng = np.random.default_rng(seed)
    values = rng.choice([-1.0, 1.0], size=count) * np.exp2(rng.uniform(-20, 0, count))
    return rng.integers(0, n_bins, size=count), values.astype(np.float32).astype(np.float64)


def reduce_on(ring: TcpCollective, bins: npt.NDArray[np.int64], values: npt.NDArray[np.float64], n_bins: int = BINS) -> tuple[FixedScale, npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    scale = FixedScale.agree(ring, float(np.abs(values).max(initial=0.0)), len(values))
    hist = FixedHistogram(n_bins, scale)
    hist.add(bins, values)
    hist.allreduce(ring)
    return scale, hist.to_f64(), hist.sums()


def run_world(world: int, data: Samples, seed: int, n_bins: int = BINS) -> list[tuple[FixedScale, npt.NDArray[np.float64], npt.NDArray[np.int64]]]:
    bins, values = data
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, world, size=len(values))
    rings = ring_of(world)

    def rank(r: int) -> tuple[FixedScale, npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        mine = np.flatnonzero(owner == r)
        rng_r = np.random.default_rng(seed + r)
        order = rng_r.permutation(mine)  # each rank's samples in its own random order
        return reduce_on(rings[r], bins[order], values[order], n_bins)

    results = on_every_rank(world, rank, limit=60.0)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def exact_sums(data: Samples, exponent: int) -> tuple[list[int], list[float]]:
    """Each bin's exact sum of the values as quantised (Python ints), and its correctly rounded
    float (math.fsum of the quantised values, each an exact float)."""
    bins, values = data
    quanta = [round(v * 2.0**exponent) for v in values.tolist()]  # exact product, ties to even
    per_bin: list[list[int]] = [[] for _ in range(BINS)]
    for b, q in zip(bins.tolist(), quanta):
        per_bin[b].append(q)
    ints = [sum(qs) for qs in per_bin]
    floats = [math.fsum(math.ldexp(q, -exponent) for q in qs) for qs in per_bin]
    return ints, floats


def as_ints(words: npt.NDArray[np.int64]) -> list[int]:
    return [int(lo) % 2**64 + (int(hi) << 64) for lo, hi in words.tolist()]


def test_every_world_and_partition_gives_the_bits_of_the_exact_sum() -> None:
    data = samples(100_000, seed=37)
    want: npt.NDArray[np.uint64] | None = None
    for world in (1, 2, 3, 5):
        for seed in (1, 2, 3):
            for scale, sums, words in run_world(world, data, seed=world * 10 + seed):
                bits = sums.view(np.uint64)
                if want is None:
                    want, exponent, held = bits, scale.exponent, as_ints(words)
                assert scale.exponent == exponent, (world, seed)
                assert np.array_equal(bits, want), f"world {world} seed {seed}: other bits"
    assert want is not None
    assert exponent == 126 - 17 - 10  # 10^5 rows (2^17), values below 2^10
    ints, floats = exact_sums(data, exponent)
    assert held == ints, "the sums are not the exact sums of the quantised values"
    assert want.view(np.float64).tolist() == floats


def test_ring_allreduce_takes_n_by_2_int64_as_i128() -> None:
    world, n = 3, 1500
    rings = ring_of(world)

    def values(rank: int) -> list[int]:
        return [((i - 700) << (rank * 50)) + rank for i in range(n)]

    def words(ints: list[int]) -> npt.NDArray[np.int64]:
        pairs = [((x % 2**64) - (2**64 if x % 2**64 >= 2**63 else 0), x >> 64) for x in ints]
        return np.array(pairs, dtype=np.int64)

    def rank(r: int) -> tuple[list[int], list[int], list[int]]:
        total = words(values(r))
        rings[r].allreduce(total, "sum")
        # A view whose memory is 8 bytes off a 16-byte boundary: reduced through a copy.
        backing = np.zeros(2 * n + 1, dtype=np.int64)
        odd = backing[1:].reshape(n, 2)
        odd[:] = words(values(r))
        rings[r].allreduce(odd, "max")
        smallest = words(values(r))
        rings[r].allreduce(smallest, "min")
        return as_ints(total), as_ints(odd), as_ints(smallest)

    columns = list(zip(*(values(r) for r in range(world))))
    for result in on_every_rank(world, rank):
        assert not isinstance(result, BaseException), result
        total, largest, smallest = result
        assert total == [sum(c) for c in columns]
        assert largest == [max(c) for c in columns]
        assert smallest == [min(c) for c in columns]


def test_refusals_and_another_scale_fail_every_rank_clearly() -> None:
    rings = ring_of(2)

    def rank(r: int) -> list[str]:
        seen = []
        scale = FixedScale.agree(rings[r], 1.0, 4)
        assert scale.bound == 2.0 and scale.local_rows == 4
        hist = FixedHistogram(8, scale)
        with pytest.raises(TypeError):
            hist.add(np.array([0]), np.array([1], dtype=np.int64))
        with pytest.raises(ValueError):
            hist.add(np.array([0, 1]), np.array([0.5]))
        if r == 1:
            with pytest.raises(CollectiveError) as refused:
                hist.add(np.array([1, 3]), np.array([0.5, 2.0]))
            assert refused.value.kind == "overflow"
            assert refused.value.kind in get_args(CollectiveErrorKind)
        try:
            hist.allreduce(rings[r])
        except CollectiveError as e:
            seen.append(f"{e.kind}: {e}")
        assert hist.to_f64().tolist() == [0.0] * 8  # emptied
        # Rank 1 keeps a scale of its own: every rank fails naming the other.
        other = FixedScale.agree(rings[r], 1000.0 if r == 1 else 1.0, 4)
        mixed = FixedHistogram(8, other if r == 1 else scale)
        try:
            mixed.allreduce(rings[r])
        except CollectiveError as e:
            assert e.kind in get_args(CollectiveErrorKind)
            seen.append(f"{e.kind} {e.peer}: {e}")
        return seen

    for r, seen in enumerate(on_every_rank(2, rank)):
        assert not isinstance(seen, BaseException), seen
        assert len(seen) == 2, seen
        assert seen[0].startswith("overflow: fixed-point overflow in bin 3: on rank 1, value 2"), seen
        assert seen[1].startswith(f"scale_mismatch {1 - r}: rank {1 - r} holds another"), seen


@pytest.fixture(scope="module")
def rust_rank() -> Iterator[Path]:
    """The Rust rank program (silvic-net's example), built with the workspace's cargo."""
    cargo = shutil.which("cargo")
    assert cargo, "cargo is needed to build the Rust ranks of the mixed ring"
    done = subprocess.run(
        [cargo, "build", "-q", "-p", "silvic-net", "--example", "fixed_histogram_rank"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    yield target / "debug" / "examples" / "fixed_histogram_rank"


# 262,144 bins and more gather every rank's report first, and their f32 gradients go as i64s.
LARGE = 262_144


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n_bins", [BINS, LARGE])
def test_python_and_rust_ranks_of_one_ring_get_the_same_bits(rust_rank: Path, n_bins: int) -> None:
    data = samples(60_000, seed=7) if n_bins == BINS else f32_samples(200_000, seed=7, n_bins=n_bins)
    alone = run_world(1, data, seed=0, n_bins=n_bins)[0][1].view(np.uint64)
    world, rust = 4, (1, 3)
    bins, values = data
    owner = np.random.default_rng(11).integers(0, world, size=len(values))
    temp = Path(tempfile.mkdtemp(prefix="svfixed-"))
    try:
        procs = {}
        for r in rust:
            mine = owner == r
            (temp / f"in{r}").write_bytes(bins[mine].astype("<i8").tobytes() + values[mine].astype("<f8").tobytes())
            procs[r] = subprocess.Popen(
                [str(rust_rank), str(r), str(n_bins), str(temp / f"in{r}"), str(temp / f"out{r}")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
        listeners = {r: TcpCollective.bind("127.0.0.1") for r in range(world) if r not in rust}
        addresses = {r: l.address() for r, l in listeners.items()}
        for r, p in procs.items():
            assert p.stdout is not None
            line = p.stdout.readline().split()
            assert line[:1] == ["ADDR"], line
            addresses[r] = line[1]
        every = [addresses[r] for r in range(world)]
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write(" ".join(every) + "\n")
            p.stdin.flush()

        def python_rank(r: int) -> npt.NDArray[np.uint64]:
            ring = TcpCollective.connect(listeners[r], r, every, "fixed-histogram", timeout=60.0)
            mine = owner == r
            return reduce_on(ring, bins[mine], values[mine], n_bins)[1].view(np.uint64)

        python = on_every_rank(len(listeners), lambda i: python_rank(sorted(listeners)[i]), limit=120.0)
        for p in procs.values():
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
        for bits in python:
            assert not isinstance(bits, BaseException), bits
            assert np.array_equal(bits, alone), "a Python rank got other bits"
        for r in rust:
            got = np.frombuffer((temp / f"out{r}").read_bytes(), dtype="<u8")
            assert np.array_equal(got, alone), f"Rust rank {r} got other bits"
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_the_example_runs_and_its_bits_match_a_one_rank_run() -> None:
    example = ROOT / "examples" / "fixed_histogram.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for world in (2, 3, 4):
        line = next(l for l in lines if l.startswith(f"world {world}:"))
        assert "fixed-point bits equal the one-rank run's: True" in line, done.stdout
