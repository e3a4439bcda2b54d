#!/usr/bin/env python3
"""The simulator against the relay bed (docs/simulator.md, "Against the relay bed").

`run` measures the bed: for each run, world (4, 8, 16) and delay (100, 500 us), interleaved
world by world, the grid (32 KiB to 16 MiB), an 8-byte allgather (for the hop) and 4 MiB
allreduces (for the copy rate; and 8 MiB ones beside them), each into its own file of DIR. `fit` solves, per cell, the hop
at which the simulator gives the bed's median 8-byte allgather and the copy rate at which it
gives the bed's median 4 MiB allreduce, both on `--cores 2 --network-copies 3` (the relays'
copies), by bisection on the simulator; then
prints the table of simulated / bed medians, the bed's runs and the calibration.

    python3 scripts/simulator-vs-relay-bed.py run DIR 1,2,3 [BED]
    python3 scripts/simulator-vs-relay-bed.py fit DIR 1,2,3 [SIMULATOR]

BED and SIMULATOR default to target/release/silvic-bench (build it with
`cargo build --release -p silvic-bench`).
"""

import math
import os
import statistics
import subprocess
import sys

WORLDS = (4, 8, 16)
DELAYS = (100, 500)
SIZES = (32 << 10, 256 << 10, 1 << 20, 16 << 20)
CALIBRATION = 4 << 20
CORES = 2
# The relay's copies of each byte: read, kept as a chunk, written on.
NETWORK_COPIES = 3


def run(out, runs, bed):
    """Measures every cell once per run; the load average goes beside each."""
    os.makedirs(out, exist_ok=True)
    for r in runs:
        for world in WORLDS:
            for delay in DELAYS:
                cell = os.path.join(out, f"w{world}_d{delay}_r{r}")
                base = [bed, "--threads", "--world", str(world), "--link-delay-us", str(delay)]
                with open(cell + ".load", "w") as f:
                    f.write(open("/proc/loadavg").read())
                sweeps = {
                    "grid": ["--sizes", "32K,256K,1M,16M"],
                    "hop": ["--op", "allgather", "--sizes", "8"],
                    "cal1": ["--sizes", "4M", "--seconds-per-size", "1"],
                    "cal4": ["--sizes", "4M", "--seconds-per-size", "4"],
                    "big": ["--sizes", "4M,8M"],
                }
                for name, args in sweeps.items():
                    with open(f"{cell}.{name}", "w") as f:
                        subprocess.run(base + args + ["--csv", "-q"], stdout=f, timeout=300)


def rows(path):
    """The CSV rows of a bench output, or none."""
    if not os.path.exists(path):
        return []
    return [line.strip().split(",") for line in open(path) if line[:1].isdigit()]


def simulate(simulator, world, flags, sizes):
    """Simulated milliseconds per size in bytes."""
    args = [simulator, "--simulate", "--world", str(world), *flags, "--sizes", sizes, "--csv", "-q"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return {int(f[1]): float(f[4]) / 1000 for f in (l.split(",") for l in out.splitlines()) if f[0].isdigit()}


def bisect(lo, hi, below, steps=30):
    """The x in [lo, hi] where below(x) turns from true to false."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if below(mid):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit(out, runs, simulator):
    table, measured, calibration, within = [], [], [], 0
    bed_flags = ["--cores", str(CORES), "--network-copies", str(NETWORK_COPIES)]
    for world in WORLDS:
        for delay in DELAYS:
            grid = {s: [] for s in SIZES}
            gathers, allreduces, loads = [], [], []
            for r in runs:
                cell = os.path.join(out, f"w{world}_d{delay}_r{r}")
                for f in rows(cell + ".grid"):
                    grid[int(f[1])].append(float(f[4]) / 1000)
                gathers += [float(f[4]) / 1000 for f in rows(cell + ".hop")]
                for name in ("cal1", "cal4", "big"):
                    allreduces += [float(f[4]) / 1000 for f in rows(f"{cell}.{name}") if int(f[1]) == CALIBRATION]
                if os.path.exists(cell + ".load"):
                    loads.append(open(cell + ".load").read().split("load average:")[-1].split()[0].strip(", "))
            if not gathers or not allreduces:
                continue
            gather, allreduce = statistics.median(gathers), statistics.median(allreduces)

            def flags(hop, copy):
                return ["--hop-us", f"{hop:.2f}", "--copy-gbyte", f"{copy:.4f}", *bed_flags]

            def hop_for(copy):
                # A hop over 150 us: the bed's, where the allgather takes Bruck's rounds.
                faster = lambda h: simulate(simulator, world, ["--op", "allgather"] + flags(h, copy), "8")[8] < gather
                return bisect(150.0, 20000.0, faster)

            def copy_for(hop):
                hop = round(hop, 1)
                at = lambda c: simulate(simulator, world, flags(hop, math.exp(c)), str(CALIBRATION))[CALIBRATION]
                return math.exp(bisect(math.log(0.01), math.log(200.0), lambda c: at(c) > allreduce))

            hop = hop_for(20.0)
            copy = copy_for(hop)
            hop = hop_for(copy)
            copy = copy_for(hop)
            shown = ["--hop-us", f"{hop:.1f}", "--copy-gbyte", f"{copy:.3g}", *bed_flags]
            got = simulate(simulator, world, shown, "32K,256K,1M,16M")
            cells = []
            for size in SIZES:
                bed = statistics.median(grid[size])
                ratio = got[size] / bed
                within += 0.7 <= ratio <= 1.3
                mark = "" if 0.7 <= ratio <= 1.3 else " ✗"
                cells.append(f"{got[size]:.2f} / {bed:.2f} = **{ratio:.2f}**{mark}")
            table.append(f"| {world} | {delay} | `{' '.join(shown)}` | " + " | ".join(cells) + " |")
            runs_of = lambda size: ", ".join(f"{v:.2f}" for v in grid[size])
            measured.append(f"| {world}, {delay} | " + " | ".join(runs_of(s) for s in SIZES) + " |")
            calibration.append(
                f"| {world}, {delay} | {', '.join(f'{g:.2f}' for g in gathers)} | "
                f"{', '.join(f'{a:.2f}' for a in allreduces)} | {', '.join(loads)} |"
            )
    print("| world | delay (us) | simulator flags | 32 KiB | 256 KiB | 1 MiB | 16 MiB |")
    print("|---|---:|---|---:|---:|---:|---:|")
    print("\n".join(table))
    print(f"\n{within} of {4 * len(table)} cells within ±30%\n")
    print("| world, delay | 32 KiB | 256 KiB | 1 MiB | 16 MiB |\n|---|---|---|---|---|")
    print("\n".join(measured))
    print("\n| world, delay | 8-byte allgathers (ms) | 4 MiB allreduces (ms) | load average |")
    print("|---|---|---|---|")
    print("\n".join(calibration))


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("run", "fit"):
        sys.exit(__doc__)
    what, out, runs = sys.argv[1], sys.argv[2], [int(r) for r in sys.argv[3].split(",")]
    binary = sys.argv[4] if len(sys.argv) > 4 else "target/release/silvic-bench"
    (run if what == "run" else fit)(out, runs, binary)


if __name__ == "__main__":
    main()
