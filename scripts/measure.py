#!/usr/bin/env python3
"""Measures one bed and writes its results file, docs/results/BED.csv, for render-results.py.

Each bed runs in rounds: every series of a round (an implementation, a path, a world) runs once,
one after another, so a ratio between series is of interleaved runs. The file starts with `#`
lines that say what ran: the command of every series, the commit, the date (UTC), the machine,
and the load average around each round; then one CSV row per size, series and round.

    python3 scripts/measure.py loopback  [--rounds 3] [--peers DIR]     # against the peers
    python3 scripts/measure.py relay     [--rounds 3]                   # the relay bed
    sudo python3 scripts/measure.py netns [--rounds 3]                  # namespace hosts (root)
    python3 scripts/measure.py simulator                                # the model: one round
    sudo python3 scripts/measure.py fixed [--rounds 3]                  # fixed point vs f64 (root)
    python3 scripts/measure.py paths     [--rounds 3] [--worlds 4,8,16] # auto against every path
                                         [--beds relay,loopback,simulator]
    python3 scripts/measure.py cut       [--rounds 3]                   # gather against ring
    python3 scripts/measure.py channels --base BIN [--rounds 5]         # channels on 2 cores

Build silvic-bench first (`cargo build --release -p silvic-bench`). The loopback bed runs the
peers of DIR (default $SILVIC_PEERS, see its README: `run_mpi.sh`, `run_xgb.sh`,
`gloo_allreduce_bench.py`) where their programs are installed, and says in the file which were
not. --python names the interpreter for XGBoost and --gloo-python the one with torch.

The paths bed runs `--path auto` and every path forced, interleaved, on the relay bed (hops 1,
100 and 500 us) and on loopback with one process per rank, and once on the simulator at the same
hops (10 Gbit/s links, a host per rank); each run's row also says what connect's probes measured
(rank 0's log), for comparison with what the bed carries (the forced ring's busbw at 16 MiB).
--beds re-measures some of its beds and keeps the file's rows of the others (a note says from
which run). The cut bed runs the gather and the ring forced, interleaved, on loopback at worlds
2 to 16 and sizes around the cut between them.
The channels bed compares this build's channel counts with each other, and its small calls with
--base, a silvic-bench built from the code before channels.
"""

import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "target", "release", "silvic-bench")
RESULTS = os.path.join(ROOT, "docs", "results")
PEER_COLUMNS = ["world", "bytes", "iters", "reps", "median_us", "min_us", "algbw_GBs", "busbw_GBs"]
TIMEOUT = 900


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = int(next(l.split()[1] for l in f if l.startswith("MemTotal")))
            memory = f", {kib / (1 << 20):.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()} cores ({model}){memory}, Linux {platform.release()}"


def commit():
    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout
    head = git("rev-parse", "--short=12", "HEAD").strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "crates", "Cargo.lock")
    return head + (" with uncommitted changes to crates/" if dirty.strip() else "")


def load():
    return "{:.1f}".format(os.getloadavg()[0])


def run_json(command):
    """The JSON rows a command prints (one object per line)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]


def run(command, env=None, output=False):
    """The CSV rows a command prints (lines that start with a digit, after its header); with
    `output`, also everything else it printed (its `#` lines and its stderr)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                          env=dict(os.environ, **(env or {})))
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    lines = done.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("world,"))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    return (rows, "\n".join(lines[:start]) + "\n" + done.stderr) if output else rows


class Results:
    def __init__(self, bed, title, columns):
        self.bed, self.title, self.columns = bed, title, columns
        self.commands, self.notes, self.rows, self.loads = {}, [], [], []
        self.flags = ""

    def series(self, name, command):
        self.commands[name] = command

    def write(self, rounds, note):
        path = os.path.join(RESULTS, f"{self.bed}.csv")
        os.makedirs(RESULTS, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(f"# {self.title}\n")
            f.write(f"# measured: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} (UTC)"
                    f" by `python3 scripts/{os.path.basename(__file__)} {self.bed}"
                    f" --rounds {rounds}{self.flags}`\n")
            f.write(f"# commit: {commit()}\n")
            f.write(f"# machine: {machine()}\n")
            f.write(f"# load average (1 min) before each round and after the last: "
                    f"{', '.join(self.loads)}\n")
            f.write(f"# note: {note}\n")
            for n in self.notes:
                f.write(f"# note: {n}\n")
            f.write(f"# rounds: {rounds}, each running every series once, in the order below\n")
            for name, command in self.commands.items():
                f.write(f"# series {name}: {command}\n")
            writer = csv.DictWriter(f, fieldnames=self.columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(self.rows)
        print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)


def loopback(args):
    r = Results("loopback", "loopback, one process per rank: silvic-net against the peers "
                "(f64 sum, the peers' timing protocol)", ["series", "round"] + PEER_COLUMNS)
    worlds = {2: 64 << 20, 4: 64 << 20, 8: 16 << 20}
    peers = args.peers
    runs = []  # (series, world, command, env)
    for world, top in worlds.items():
        runs.append(("silvic-net", world, [BENCH, "--world", str(world), "--max-bytes", str(top),
                                           "--csv", "-q"], None))
    r.series("silvic-net", "target/release/silvic-bench --world W --max-bytes M --csv -q")
    build = os.environ.get("PEERS_BUILD", os.path.join("/tmp", "silvic-peers"))
    if peers and shutil.which("mpirun") and os.path.exists(os.path.join(build, "mpi_allreduce_bench")):
        version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
        version = version.splitlines()[0] if version else "OpenMPI"
        for world, top in worlds.items():
            runs.append(("openmpi-tcp", world, [os.path.join(peers, "run_mpi.sh"), str(world),
                                                "tcp", str(top), "1"], None))
        r.series("openmpi-tcp", f"run_mpi.sh W tcp M 1 ({version}, MPI_Allreduce over the TCP BTL)")
    else:
        r.notes.append("OpenMPI not run: mpirun or the peers' build (run build.sh) missing")
    py_env = {"PATH": os.path.dirname(args.python) + os.pathsep + os.environ["PATH"]}
    xgb = subprocess.run([args.python, "-c", "import xgboost; print(xgboost.__version__)"],
                         capture_output=True, text=True)
    if peers and xgb.returncode == 0:
        for world, top in worlds.items():
            runs.append(("xgboost", world, [os.path.join(peers, "run_xgb.sh"), str(world), "raw",
                                            str(top), "1"], py_env))
        r.series("xgboost", f"run_xgb.sh W raw M 1 (XGBoost {xgb.stdout.strip()}, "
                 "XGCommunicatorAllreduce in place)")
    else:
        r.notes.append("XGBoost not run: `import xgboost` failed in --python")
    gloo = subprocess.run([args.gloo_python, "-c", "import torch, torch.distributed as d; "
                           "assert d.is_gloo_available(); print(torch.__version__)"],
                          capture_output=True, text=True)
    if peers and gloo.returncode == 0:
        for world, top in worlds.items():
            runs.append(("gloo", world, [args.gloo_python,
                                         os.path.join(peers, "gloo_allreduce_bench.py"),
                                         str(world), str(top), "1"], None))
        r.series("gloo", f"gloo_allreduce_bench.py W M 1 (torch {gloo.stdout.strip()}, "
                 "torch.distributed's Gloo backend, CPU, f64)")
    else:
        r.notes.append("Gloo not run: torch with the Gloo backend not importable in --gloo-python")
    r.notes.append("W is the world (2, 4, 8); M the largest size (64 MiB, 16 MiB at world 8)")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        for world in worlds:
            for series, w, command, env in runs:
                if w != world:
                    continue
                print(f"round {rnd}: {series} world {world}", file=sys.stderr, flush=True)
                for row in run(command, env):
                    r.rows.append({"series": series, "round": rnd,
                                   **{c: row[c] for c in PEER_COLUMNS}})
    r.loads.append(load())
    return r


def relay(args):
    r = Results("relay", "the relay bed: ranks as threads, every hop through a relay holding each "
                "chunk D us each way (f64 sum)",
                ["series", "round", "delay_us"] + PEER_COLUMNS)
    sizes = "8,32K,256K,1M,16M"
    paths = ("auto", "ring")
    for path in paths:
        r.series(path, f"target/release/silvic-bench --threads --world W --link-delay-us D "
                 f"--sizes {sizes} --path {path} --csv -q")
    r.notes.append("W is the world (4, 8, 16), D the delay (100, 500 us)")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        for world in (4, 8, 16):
            for delay in (100, 500):
                for path in paths:
                    print(f"round {rnd}: world {world} delay {delay} {path}", file=sys.stderr,
                          flush=True)
                    command = [BENCH, "--threads", "--world", str(world), "--link-delay-us",
                               str(delay), "--sizes", sizes, "--path", path, "--csv", "-q"]
                    for row in run(command):
                        r.rows.append({"series": path, "round": rnd, "delay_us": delay,
                                       **{c: row[c] for c in PEER_COLUMNS}})
    r.loads.append(load())
    return r


def netns(args):
    r = Results("netns", "namespace hosts: one rank process on each host, every host's egress "
                "shaped to R Mbit/s (tc tbf), f64 sum", ["series", "round", "link_mbit"]
                + PEER_COLUMNS + ["link"])
    sizes = "2M,16M,64M"
    beds = ((4, 1000), (8, 1000), (4, 10000))
    r.series("ring", f"target/release/silvic-bench --netns-hosts N --link-mbit R --sizes {sizes} "
             "--seconds-per-size 2 --csv -q")
    r.series("flows", "target/release/silvic-bench --netns-hosts N --link-mbit R --link-limit "
             "--stream-bytes 16M --seconds-per-size 3 --csv -q (the links without the ring: "
             "every host streaming to the next, the mean per-host rate as busbw)")
    r.notes.append("N hosts and R Mbit/s: 4 and 1000, 8 and 1000, 4 and 10000")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        for hosts, mbit in beds:
            print(f"round {rnd}: {hosts} hosts at {mbit} Mbit/s", file=sys.stderr, flush=True)
            command = [BENCH, "--netns-hosts", str(hosts), "--link-mbit", str(mbit), "--sizes",
                       sizes, "--seconds-per-size", "2", "--csv", "-q"]
            for row in run(command):
                r.rows.append({"series": "ring", "round": rnd, "link_mbit": mbit,
                               "link": row["link"], **{c: row[c] for c in PEER_COLUMNS}})
            command = [BENCH, "--netns-hosts", str(hosts), "--link-mbit", str(mbit),
                       "--link-limit", "--stream-bytes", "16M", "--seconds-per-size", "3",
                       "--csv", "-q"]
            flows = run(command)
            rate = sum(float(f["GBs"]) for f in flows) / len(flows)
            share = sum(float(f["link"]) for f in flows) / len(flows)
            r.rows.append({"series": "flows", "round": rnd, "link_mbit": mbit, "world": hosts,
                           "bytes": 16 << 20, "iters": "", "reps": "", "median_us": "",
                           "min_us": "", "algbw_GBs": "", "busbw_GBs": f"{rate:.4f}",
                           "link": f"{share:.4f}"})
    r.loads.append(load())
    return r


def simulator(args):
    r = Results("simulator", "the simulator: silvic-net's plans in virtual time on a model of a "
                "network, a host per rank (f64 sum); a model, not a measurement",
                ["series", "round", "hop_us", "link_gbit"] + PEER_COLUMNS)
    sizes = "8,32K,256K,1M,16M"
    paths = ("auto", "ring", "index")
    for path in paths:
        r.series(path, f"target/release/silvic-bench --simulate --world W --hop-us H "
                 f"--link-gbit 10 --sizes {sizes} --path {path} --csv -q")
    r.notes.append("W is the world (16, 64, 256), H the hop (10, 100 us); the simulator prints "
                   "the same bytes on every run, so one round is all there is")
    r.loads.append(load())
    for world in (16, 64, 256):
        for hop in (10, 100):
            for path in paths:
                print(f"world {world} hop {hop} {path}", file=sys.stderr, flush=True)
                command = [BENCH, "--simulate", "--world", str(world), "--hop-us", str(hop),
                           "--link-gbit", "10", "--sizes", sizes, "--path", path, "--csv", "-q"]
                for row in run(command):
                    r.rows.append({"series": path, "round": 1, "hop_us": hop, "link_gbit": 10,
                                   **{c: row[c] for c in PEER_COLUMNS}})
    r.loads.append(load())
    return r


FIXED_COLUMNS = ["series", "round", "world", "elements", "f64", "fixed", "ratio"]


def fixed(args):
    r = Results("fixed", "fixed-point histograms against plain f64: the per-value add "
                "(ns a value) and the allreduce of N bins, i128 against f64 (us a call)",
                FIXED_COLUMNS)
    adds = ["cargo", "bench", "-q", "--locked", "-p", "silvic-core", "--bench", "fixed_add"]
    r.series("add", f"{shlex.join(adds)}: plain f64 histogram add against "
             "FixedHistogram::add, ns a value (medians of its 21 interleaved rounds)")
    r.series("add_many", "the same run: FixedHistogram::add_many with i64 bins")
    sizes = "1K,4K,8K,16K,32K,256K,2M,8M"
    # On loopback also f64 of twice the large sizes, for the rows of the same bytes: whether
    # i128 costs more than its bytes where calls are large.
    world = 4
    allreduce = [BENCH, "--world", str(world), "--op", "sum_f64", "--vs", "sum_i128", "--sizes",
                 sizes + ",4M,16M", "--seconds-per-size", "1"]
    r.series("allreduce", "target/release/silvic-bench " + shlex.join(allreduce[1:]) +
             " (one process per rank on loopback; N = the f64 size / 8; each repetition times "
             "both in turn in the same ring, ratio = the median of i128 / f64 over them)")
    # Loopback on few cores prices every byte in CPU, even at a few KiB; across hosts a small
    # call is mostly its hops. The relay bed gives each hop a network's latency.
    relay = [BENCH, "--threads", "--world", str(world), "--link-delay-us", "100", "--op",
             "sum_f64", "--vs", "sum_i128", "--sizes", sizes, "--seconds-per-size", "1"]
    r.series("allreduce_relay", "target/release/silvic-bench " + shlex.join(relay[1:]) +
             " (ranks as threads, every hop through a relay holding each chunk 100 us each way; "
             "the same pairs and ratio as allreduce)")
    # Namespace hosts whose links are shaped to 10 Gbit/s: a small call costs its hops and a
    # large one the link's time for its bytes, as across hosts, with the cores mostly idle.
    netns = [BENCH, "--netns-hosts", str(world), "--link-mbit", "10000", "--op", "sum_f64",
             "--vs", "sum_i128", "--sizes", sizes, "--seconds-per-size", "1"]
    r.series("allreduce_netns", "target/release/silvic-bench " + shlex.join(netns[1:]) +
             " (one rank process on each of 4 network-namespace hosts, each host's egress shaped "
             "to 10 Gbit/s by tc tbf; the same pairs and ratio as allreduce)")
    root = os.geteuid() == 0
    if not root:
        r.notes.append("allreduce_netns not run: namespace hosts need root")
    # FixedHistogram::allreduce itself, of a trainer's f32 gradients: from 262,144 bins their
    # sums go as i64s (a gather of the ranks' reports first, a pass each way over the sums).
    large = "2M,8M"
    histogram = [BENCH, "--world", str(world), "--op", "sum_f64", "--vs", "fixed_histogram",
                 "--sizes", large, "--seconds-per-size", "1"]
    r.series("histogram", "target/release/silvic-bench " + shlex.join(histogram[1:]) +
             " (FixedHistogram::allreduce of f32 gradients, two a bin on each rank, each call "
             "reducing a copy made before its repetition; one process per rank on loopback)")
    histogram_relay = [BENCH, "--threads", "--world", str(world), "--link-delay-us", "100",
                       "--op", "sum_f64", "--vs", "fixed_histogram", "--sizes", large,
                       "--seconds-per-size", "1"]
    r.series("histogram_relay", "target/release/silvic-bench " +
             shlex.join(histogram_relay[1:]) + " (the same over the relay bed's 100 us hops)")
    r.notes.append("ratio is the fixed-point time over the f64 time: for the adds, the inverse "
                   "of the rate against a plain f64 add")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        print(f"round {rnd}: adds", file=sys.stderr, flush=True)
        done = subprocess.run(adds, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(adds)} exited {done.returncode}:\n{done.stderr}")
        ns = {}
        for line in done.stdout.splitlines():
            for name, key in (("plain f64 add", "plain"), ("FixedHistogram::add ", "add"),
                              ("FixedHistogram::add_many", "add_many")):
                if line.startswith(name):
                    ns[key] = float(line.split(" ns")[0].split()[-1])
            if line.startswith("values "):
                values = int(line.split()[1].rstrip(","))
        for series in ("add", "add_many"):
            r.rows.append({"series": series, "round": rnd, "world": "", "elements": values,
                           "f64": ns["plain"], "fixed": ns[series],
                           "ratio": f"{ns[series] / ns['plain']:.3f}"})
        runs = [("allreduce", allreduce), ("allreduce_relay", relay)]
        runs += [("allreduce_netns", netns)] if root else []
        runs += [("histogram", histogram), ("histogram_relay", histogram_relay)]
        for series, command in runs:
            print(f"round {rnd}: {series}", file=sys.stderr, flush=True)
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
            if done.returncode != 0:
                raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}:\n"
                                   f"{done.stderr[-2000:]}")
            # The table's rows (size, count, type, redop, time, ...), the ratio after each pair.
            times = {}
            for line in done.stdout.splitlines():
                cells = line.split()
                if len(cells) > 4 and cells[0].isdigit() and cells[2] in ("double", "int128"):
                    times[(int(cells[1]), cells[2])] = float(cells[4])
                elif "in turn:" in line:
                    elements = int(line.split(" at ")[1].split()[0])
                    r.rows.append({"series": series, "round": rnd, "world": world,
                                   "elements": elements, "f64": times[(elements, "double")],
                                   "fixed": times[(elements, "int128")],
                                   "ratio": line.rsplit(":", 1)[1].strip()})
    r.loads.append(load())
    return r


PATHS = ("auto", "ring", "gather", "bruck", "index")
PROBED = re.compile(r"network measured hop_us=(\d+) bytes_per_us=(\d+) folds_per_us=(\d+)")
SIMULATED = re.compile(r"the probes, simulated, measured: hop ([\d.]+) us, one stream (\d+) B/us")


def paths(args):
    """`--path auto` against every path forced, on the relay bed, loopback and the simulator."""
    r = Results("paths", "the automatic path against every path forced: the relay bed (ranks as "
                "threads, every hop through a relay holding each chunk D us each way), loopback "
                "(one process per rank) and the simulator (f64 sum)",
                ["series", "round", "bed", "delay_us"] + PEER_COLUMNS
                + ["probe_hop_us", "probe_bytes_per_us"])
    sizes = "8,512,4K,32K,256K,1M,16M"
    worlds = [int(w) for w in args.worlds.split(",")]
    hops = (1, 100, 500)
    beds = args.beds.split(",")
    r.flags = f" --worlds {args.worlds}" if args.worlds != "4,8,16" else ""
    r.flags += f" --beds {args.beds}" if set(beds) != {"relay", "loopback", "simulator"} else ""
    if set(beds) - {"relay", "loopback", "simulator"}:
        sys.exit(f"--beds: relay, loopback or simulator, not {args.beds}")
    keep = {"relay", "loopback", "simulator"} - set(beds)
    if keep:
        r.rows.extend(kept_rows(r, "paths", keep))
    common = ["--sizes", sizes, "--seconds-per-size", "0.3", "--warmup", "3", "--csv", "-q"]
    relay = "target/release/silvic-bench --threads --world W --link-delay-us D"
    r.series("relay", f"{relay} {shlex.join(common)} --path P")
    r.series("loopback", f"target/release/silvic-bench --world W {shlex.join(common)} --path P")
    r.series("simulator", f"target/release/silvic-bench --simulate --world W --hop-us D "
             f"--link-gbit 10 --sizes {sizes} --csv -q --path P")
    r.notes.append(f"W is the world ({args.worlds}), D the delay or hop (1, 100, 500 us), P the "
                   "path: auto, then every path forced, in an order rotated every round; bruck "
                   "and index only from 8 ranks (chord streams), and a forced path that cannot "
                   "carry a call (gather and bruck past 1 MiB gathered) takes auto's")
    r.notes.append("probe_hop_us and probe_bytes_per_us: what connect's probes measured in that "
                   "run (rank 0's `network measured` event at RUST_LOG=silvic_net::probe=debug; "
                   "the simulator's preamble); the simulator's link carries 1250 B/us")
    log = {"RUST_LOG": "silvic_net::probe=debug"}

    def record(rows, output, rnd, bed, delay, path):
        probed = PROBED.search(output) or SIMULATED.search(output)
        hop, rate = probed.groups()[:2] if probed else ("", "")
        for row in rows:
            r.rows.append({"series": path, "round": rnd, "bed": bed, "delay_us": delay,
                           **{c: row[c] for c in PEER_COLUMNS},
                           "probe_hop_us": hop, "probe_bytes_per_us": rate})

    for world in worlds if "simulator" in beds else []:
        for hop in hops:
            model = [BENCH, "--simulate", "--world", str(world), "--hop-us", str(hop),
                     "--link-gbit", "10"]
            # The table's preamble says what the simulated probes measured (the CSV has none).
            table = subprocess.run(model + ["--sizes", "8", "-q"], capture_output=True,
                                   text=True, timeout=TIMEOUT, check=True).stdout
            for path in PATHS if world >= 8 else PATHS[:3]:
                rows = run(model + ["--sizes", sizes, "--csv", "-q", "--path", path])
                record(rows, table, 1, "simulator", hop, path)
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        for world in worlds:
            here = PATHS if world >= 8 else PATHS[:3]
            turn = (rnd - 1) % len(here)
            order = here[turn:] + here[:turn]
            runs = [("relay", hop) for hop in hops] + [("loopback", "")]
            for bed, delay in [(b, d) for b, d in runs if b in beds]:
                for path in order:
                    print(f"round {rnd}: {bed} world {world} delay {delay} {path} (load "
                          f"{load()})", file=sys.stderr, flush=True)
                    command = [BENCH, "--world", str(world)] + common + ["--path", path]
                    if bed == "relay":
                        command += ["--threads", "--link-delay-us", str(delay)]
                    record(*run(command, log, output=True), rnd, bed, delay, path)
    r.loads.append(load())
    return r


def kept_rows(r, bed, keep):
    """The rows of docs/results/BED.csv whose `bed` column is in `keep`, with a note of the run
    that measured them (its own `#` lines), for a bed re-measured only in part."""
    path = os.path.join(RESULTS, f"{bed}.csv")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    said = {l[2:].split(":", 1)[0]: l[2:].split(":", 1)[1].strip()
            for l in lines if l.startswith("# ") and ":" in l}
    rows = [row for row in csv.DictReader(l for l in lines if not l.startswith("#"))
            if row["bed"] in keep]
    # Rows the file itself kept from a run before it keep that run's note.
    kept = re.compile(r"# note: the (\w+(?: and \w+)*) rows are kept from an earlier run")
    fresh = set(keep)
    for line in lines:
        match = kept.match(line)
        beds = set(match.group(1).split(" and ")) if match else set()
        if beds and beds <= keep:
            r.notes.append(line[len("# note: "):])
            fresh -= beds
    if fresh:
        r.notes.append(f"the {' and '.join(sorted(fresh))} rows are kept from an earlier run of "
                       f"this bed, not re-measured: {said.get('measured', '?')}, commit "
                       f"{said.get('commit', '?')}, load average "
                       f"{said.get('load average (1 min) before each round and after the last', '?')}")
    return rows


def cut(args):
    """The gather and the ring forced on loopback, around the cut between them."""
    r = Results("cut", "the cut between the gather and the ring on loopback, one process per "
                "rank: both paths forced, at sizes around the cut (f64 sum)",
                ["series", "round"] + PEER_COLUMNS + ["probe_hop_us"])
    sizes = {2: "16K,32K,48K,64K,128K,256K,512K", 4: "8K,16K,24K,32K,40K,48K,64K,128K",
             8: "8K,12K,16K,20K,24K,32K,48K", 16: "4K,8K,12K,16K,20K,24K,32K"}
    paths = ("gather", "ring")
    common = ["--seconds-per-size", "0.3", "--warmup", "3", "--csv", "-q"]
    r.series("loopback", f"target/release/silvic-bench --world W --sizes S {shlex.join(common)} "
             "--path P")
    r.notes.append("W is the world; S its sizes (up to the gather's memory bound, 1 MiB "
                   "gathered): " + "; ".join(f"{w}: {s}" for w, s in sizes.items()))
    r.notes.append("P the path: gather and ring, in an order swapped every round")
    r.notes.append("probe_hop_us: the hop connect's probes measured in that run (rank 0's "
                   "`network measured` event at RUST_LOG=silvic_net::probe=debug); below 100 us "
                   "the automatic path is the cut's, from 100 us the cost model's at the measured "
                   "rates")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        turn = (rnd - 1) % len(paths)
        for world, here in sizes.items():
            for path in paths[turn:] + paths[:turn]:
                print(f"round {rnd}: world {world} {path} (load {load()})", file=sys.stderr,
                      flush=True)
                command = [BENCH, "--world", str(world), "--sizes", here] + common + [
                    "--path", path]
                rows, output = run(command, {"RUST_LOG": "silvic_net::probe=debug"}, output=True)
                probed = PROBED.search(output)
                for row in rows:
                    r.rows.append({"series": path, "round": rnd,
                                   **{c: row[c] for c in PEER_COLUMNS},
                                   "probe_hop_us": probed.group(1) if probed else ""})
    r.loads.append(load())
    return r


def channels(args):
    """Channels on a small machine: the relay bed with each stream capped (C = 4 against C = 1),
    the CPU per call at 16 MiB (C = 4 against C = 1, on loopback), and loopback's small calls
    against the code before channels (--base), all interleaved round by round."""
    if not args.base or not os.path.exists(args.base):
        sys.exit("the channels bed needs --base: a silvic-bench built from the code before channels")
    columns = ["series", "round", "part"] + PEER_COLUMNS + ["cpu_us"]
    r = Results("channels", "channels: the relay bed with every stream capped at 250 Mbit/s each "
                "way (world 4, 16 MiB, f64 sum, ranks as threads), CPU per call on loopback at "
                "16 MiB, and loopback's small calls against the code before channels", columns)
    relay = [BENCH, "--threads", "--world", "4", "--flow-mbit", "250", "--sizes", "16M", "--cpu"]
    cpu = [BENCH, "--threads", "--world", "4", "--sizes", "16M", "--cpu"]
    small = "8,64,512,4K,32K,256K"
    runs = []  # (series, part, command)
    for c in ("1", "4"):
        runs.append((f"c{c}", "relay", relay + ["--channels", c]))
        r.series(f"relay c{c}", f"target/release/silvic-bench --threads --world 4 --flow-mbit 250 "
                 f"--sizes 16M --cpu --channels {c} --json -q")
    for c in ("1", "4"):
        runs.append((f"c{c}", "cpu", cpu + ["--channels", c]))
        r.series(f"cpu c{c}", f"target/release/silvic-bench --threads --world 4 --sizes 16M --cpu "
                 f"--channels {c} --json -q")
    for world in ("2", "4"):
        for name, bench in (("base", args.base), ("channels", BENCH)):
            runs.append((name, f"small-w{world}", [bench, "--world", world, "--sizes", small]))
    r.series("small base", f"BASE --world W --sizes {small} --json -q (BASE: silvic-bench built "
             "from the code before channels)")
    r.series("small channels", f"target/release/silvic-bench --world W --sizes {small} --json -q "
             "(channels chosen: auto)")
    r.notes.append("W is the world (2, 4), one process per rank; part small-wW")
    r.notes.append("cpu_us: CPU per call summed over ranks, each rank's calling thread and its "
                   "channels' threads (--cpu)")
    for rnd in range(1, args.rounds + 1):
        r.loads.append(load())
        for series, part, command in runs:
            print(f"round {rnd}: {part} {series}", file=sys.stderr, flush=True)
            for row in run_json(command + ["--json", "-q"]):
                cpu_us = row.get("cpu_us")
                shown = {"median_us": "{:.3f}", "min_us": "{:.3f}", "algbw_GBs": "{:.4f}",
                         "busbw_GBs": "{:.4f}"}
                r.rows.append({"series": series, "round": rnd, "part": part,
                               **{c: shown.get(c, "{}").format(row[c]) for c in PEER_COLUMNS},
                               "cpu_us": "" if cpu_us is None else f"{cpu_us:.1f}"})
    r.loads.append(load())
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bed", choices=["loopback", "relay", "netns", "simulator", "fixed",
                                        "paths", "cut", "channels"])
    parser.add_argument("--base", help="a silvic-bench built from the code before channels "
                        "(channels)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default=os.environ.get("SILVIC_PEERS"),
                        help="the peers' scripts (loopback)")
    parser.add_argument("--python", default=sys.executable, help="a Python with xgboost")
    parser.add_argument("--gloo-python", default=sys.executable, help="a Python with torch")
    parser.add_argument("--worlds", default="4,8,16", help="the worlds (paths)")
    parser.add_argument("--beds", default="relay,loopback,simulator",
                        help="the beds to measure (paths); the file keeps the others' rows")
    parser.add_argument("--note", default="the machine was shared with other developers' builds "
                        "and tests while these ran (see the load average)")
    args = parser.parse_args()
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} missing: cargo build --release -p silvic-bench")
    results = {"loopback": loopback, "relay": relay, "netns": netns,
               "simulator": simulator, "fixed": fixed, "paths": paths, "cut": cut,
               "channels": channels}[args.bed](args)
    results.write(1 if args.bed == "simulator" else args.rounds, args.note)


if __name__ == "__main__":
    main()
