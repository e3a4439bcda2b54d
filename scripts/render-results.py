#!/usr/bin/env python3
"""Renders every table and plot docs/ shows from the results files of docs/results/.

A page shows a rendered table between two markers, which this script owns:

    <!-- render: NAME -->
    ... (written by this script: do not edit)
    <!-- end render -->

NAME is a table of RENDERS below, made from one results file (docs/results/BED.csv, written by
scripts/measure.py: `#` lines saying what ran, then CSV). The plots are SVG files of
docs/results/, made from the same files. Each cell is the median over the file's rounds.

    python3 scripts/render-results.py           # rewrite the pages' tables and the plots
    python3 scripts/render-results.py --check   # exit 1 if a page or plot differs (CI)

Only the standard library: the plot is SVG written by hand, byte for byte the same every run.
"""

import argparse
import csv
import io
import math
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
MARKER = re.compile(r"(<!-- render: (\S+) -->\n)(.*?)(<!-- end render -->)", re.S)
NAMES = {"silvic-net": "silvic-net", "openmpi-tcp": "OpenMPI-TCP", "xgboost": "XGBoost",
         "gloo": "Gloo"}
COLOURS = {"silvic-net": "#1b6ac9", "openmpi-tcp": "#d9480f", "xgboost": "#2b8a3e",
           "gloo": "#862e9c"}


def load(bed):
    """The `#` lines (as one text) and the rows of docs/results/BED.csv."""
    text = (RESULTS / f"{bed}.csv").read_text(encoding="utf-8")
    lines = text.splitlines()
    notes = [l for l in lines if l.startswith("#")]
    rows = list(csv.DictReader(io.StringIO("\n".join(l for l in lines if not l.startswith("#")))))
    return notes, rows


def median(rows, column):
    values = [float(r[column]) for r in rows if r[column] != ""]
    return statistics.median(values) if values else None


def group(rows, *keys):
    out = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append(row)
    return out


def size(b):
    b = int(b)
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def duration(us):
    if us is None:
        return ""
    if us < 1000:
        return f"{us:.1f} us"
    return f"{us / 1000:.2f} ms"


def rounds(rows):
    return len({r["round"] for r in rows})


def source(bed, rows, what):
    n = rounds(rows)
    runs = "one run" if n == 1 else f"medians of {n} interleaved rounds"
    return (f"From [results/{bed}.csv](results/{bed}.csv) ({what}; {runs}; the file gives the "
            f"commands, the machine, the date and the load).")


def loopback():
    notes, rows = load("loopback")
    series = [s for s in NAMES if any(r["series"] == s for r in rows)]
    peers = [s for s in series if s != "silvic-net"]
    out = [source("loopback", rows, "median time of a call, f64 sum, one process per rank")]
    missing = [l.split("note: ", 1)[1] for l in notes if "not run" in l]
    if missing:
        out.append("Not run there: " + "; ".join(missing) + ".")
    cells = {k: median(v, "median_us") for k, v in group(rows, "series", "world", "bytes").items()}
    for world in sorted({int(r["world"]) for r in rows}):
        out.append("")
        out.append(f"World {world}:")
        out.append("")
        head = ["size"] + [NAMES[s] for s in series] + ["silvic-net / fastest peer"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---|" + "---:|" * (len(head) - 1))
        sizes = sorted({int(r["bytes"]) for r in rows if int(r["world"]) == world})
        for b in sizes:
            times = {s: cells.get((s, str(world), str(b))) for s in series}
            best = min((t for s, t in times.items() if s in peers and t), default=None)
            ours = times.get("silvic-net")
            ratio = f"{ours / best:.2f}x" if ours and best else ""
            out.append("| " + " | ".join([size(b)] + [duration(times[s]) for s in series]
                                         + [ratio]) + " |")
    return "\n".join(out) + "\n"


def relay():
    _, rows = load("relay")
    sizes = sorted({int(r["bytes"]) for r in rows})
    cells = {k: median(v, "median_us") for k, v in
             group(rows, "series", "world", "delay_us", "bytes").items()}
    out = [source("relay", rows, "median time of a call, f64 sum, ranks as threads"), "",
           "Each cell: the automatic path's time, then the ring path's, forced (`--path ring`), "
           "and the first over the second.", ""]
    out.append("| world, hop delay | " + " | ".join(size(b) for b in sizes) + " |")
    out.append("|---|" + "---:|" * len(sizes))
    keys = sorted({(int(r["world"]), int(r["delay_us"])) for r in rows})
    for world, delay in keys:
        row = [f"{world}, {delay} us"]
        for b in sizes:
            auto = cells.get(("auto", str(world), str(delay), str(b)))
            ring = cells.get(("ring", str(world), str(delay), str(b)))
            ratio = f" ({auto / ring:.2f}x)" if auto and ring else ""
            row.append(f"{duration(auto)} / {duration(ring)}{ratio}")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def netns():
    _, rows = load("netns")
    ring = [r for r in rows if r["series"] == "ring"]
    flows = [r for r in rows if r["series"] == "flows"]
    sizes = sorted({int(r["bytes"]) for r in ring})
    busbw = {k: (median(v, "busbw_GBs"), median(v, "link")) for k, v in
             group(ring, "world", "link_mbit", "bytes").items()}
    carried = {k: (median(v, "busbw_GBs"), median(v, "link")) for k, v in
               group(flows, "world", "link_mbit").items()}
    out = [source("netns", rows, "busbw in GB/s and its share of the link rate"), "",
           "The last column is what the same links carried without the ring in the same rounds "
           "(every host streaming to the next through 16 MiB buffers, as iperf3 flows laid out "
           "like the ring would).", ""]
    out.append("| hosts, link | " + " | ".join(size(b) for b in sizes) + " | the links alone |")
    out.append("|---|" + "---:|" * (len(sizes) + 1))
    for hosts, mbit in sorted({(int(r["world"]), int(r["link_mbit"])) for r in ring}):
        def cell(pair):
            return f"{pair[0]:.3f} ({pair[1]:.2f})" if pair and pair[0] is not None else ""
        row = [f"{hosts}, {mbit // 1000} Gbit/s"]
        row += [cell(busbw.get((str(hosts), str(mbit), str(b)))) for b in sizes]
        row.append(cell(carried.get((str(hosts), str(mbit)))))
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def simulator():
    notes, rows = load("simulator")
    sizes = sorted({int(r["bytes"]) for r in rows})
    cells = {k: median(v, "median_us") for k, v in
             group(rows, "series", "world", "hop_us", "bytes").items()}
    link = sorted({r["link_gbit"] for r in rows})
    out = [source("simulator", rows, f"modelled time of a call, f64 sum, {', '.join(link)} "
                  "Gbit/s links, a host per rank"), "",
           "Each cell: the automatic path's time, the ring path's and index-fold-gather's, each "
           "forced; the automatic choice is the real cut, run on the model.", ""]
    out.append("| world, hop | " + " | ".join(size(b) for b in sizes) + " |")
    out.append("|---|" + "---:|" * len(sizes))
    for world, hop in sorted({(int(r["world"]), int(r["hop_us"])) for r in rows}):
        row = [f"{world}, {hop} us"]
        for b in sizes:
            key = (str(world), str(hop), str(b))
            parts = [duration(cells.get((s,) + key)) for s in ("auto", "ring", "index")]
            row.append(" / ".join(parts))
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def fixed():
    _, rows = load("fixed")
    cells = {k: [median(v, c) for c in ("f64", "fixed", "ratio")]
             for k, v in group(rows, "series", "elements").items()}
    worlds = sorted({r["world"] for r in rows if r["world"]})
    beds = ["one process per rank on loopback", "ranks as threads over the relay bed's 100 us hops"]
    if any(r["series"] == "allreduce_netns" for r in rows):
        beds.append("one rank on each of 4 network-namespace hosts whose links are shaped to "
                    "10 Gbit/s")
    out = [source("fixed", rows, "fixed point against f64; the allreduce at world "
                  f"{', '.join(worlds)}: {', '.join(beds[:-1])}, and {beds[-1]}"), "",
           "The last column is the median over the rounds of each round's fixed-point time over "
           "its f64 time, the two timed in turn; in the rows of the same bytes, over the f64 "
           "time of twice the bins in the same round (the same run, not in turn).", ""]
    out.append("| | f64 | fixed point | fixed / f64 |")
    out.append("|---|---:|---:|---:|")

    def sizes_of(series):
        """The series' cells, by bins."""
        return sorted((int(n), c) for (s, n), c in cells.items() if s == series)

    names = {"add": "a value added: `FixedHistogram::add` against `hist[bin] += value`",
             "add_many": "a value added by `add_many` (i64 bins), against the same"}
    for series, name in names.items():
        for _, (f64, fixed_, ratio) in sizes_of(series):
            out.append(f"| {name} | {f64:.2f} ns | {fixed_:.2f} ns | {ratio:.2f}x |")

    allreduce = sizes_of("allreduce")
    for n, (f64, fixed_, ratio) in allreduce:
        name = f"allreduce of {n} bins ({size(8 * n)} f64, {size(16 * n)} i128)"
        out.append(f"| {name} | {duration(f64)} | {duration(fixed_)} | {ratio:.2f}x |")
    for series, where in (("allreduce_relay", "over 100 us hops"),
                          ("allreduce_netns", "on namespace hosts linked at 10 Gbit/s")):
        for n, (f64, fixed_, ratio) in sizes_of(series):
            name = f"the same {where}: {n} bins"
            out.append(f"| {name} | {duration(f64)} | {duration(fixed_)} | {ratio:.2f}x |")
    for series, where in (("histogram", ""), ("histogram_relay", " over 100 us hops")):
        for n, (f64, fixed_, ratio) in sizes_of(series):
            name = (f"`FixedHistogram::allreduce` of {n} bins of f32 gradients{where} "
                    f"(as i64s: {size(8 * n)})")
            out.append(f"| {name} | {duration(f64)} | {duration(fixed_)} | {ratio:.2f}x |")
    # The same bytes: i128 of N bins against f64 of 2N bins, from the same round's rows.
    timed = {(r["round"], int(r["elements"])): r for r in rows if r["series"] == "allreduce"}
    for n, _ in allreduce:
        pairs = [(float(timed[(rnd, 2 * n)]["f64"]), float(r["fixed"]))
                 for (rnd, m), r in timed.items() if m == n and (rnd, 2 * n) in timed]
        if not pairs:
            continue
        f64, fixed_ = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        ratio = statistics.median(b / a for a, b in pairs)
        name = f"allreduce of the same bytes: {n} bins i128 against {2 * n} bins f64 ({size(16 * n)})"
        out.append(f"| {name} | {duration(f64)} | {duration(fixed_)} | {ratio:.2f}x |")
    return "\n".join(out) + "\n"


def cut():
    _, rows = load("cut")
    cells = {k: median(v, "median_us") for k, v in group(rows, "world", "bytes", "series").items()}
    out = [source("cut", rows, "median time of a call, f64 sum, one process per rank on "
                  "loopback"), "",
           "Each row: the two paths forced, and the ring's time over the gather's: below 1.00 "
           "the ring is faster.", ""]
    out.append("| world | size | gather | ring | ring / gather |")
    out.append("|---:|---:|---:|---:|---:|")
    for world, b in sorted({(int(r["world"]), int(r["bytes"])) for r in rows}):
        gather, ring = (cells.get((str(world), str(b), p)) for p in ("gather", "ring"))
        if gather and ring:
            out.append(f"| {world} | {size(b)} | {duration(gather)} | {duration(ring)} | "
                       f"{ring / gather:.2f} |")
    return "\n".join(out) + "\n"


def carries(path, world, b):
    """Whether a forced `path` carries a call of `b` bytes in a world of `world` (else the call
    takes the automatic path): chords from 8 ranks, the gathers within 1 MiB gathered."""
    chords = path not in ("bruck", "index") or world >= 8
    fits = path not in ("gather", "bruck") or b < 4096 or world * b <= 1 << 20
    return chords and fits


def paths():
    _, rows = load("paths")
    sizes = sorted({int(r["bytes"]) for r in rows})
    cells = {k: median(v, "median_us") for k, v in
             group(rows, "bed", "world", "delay_us", "series", "bytes").items()}
    probed = {k: median(v, "probe_bytes_per_us") for k, v in
              group(rows, "bed", "world", "delay_us").items()}
    out = [source("paths", rows, "median time of a call, f64 sum"), "",
           "Each cell: the automatic path's time, the fastest forced path's (named), and the "
           "first over the second, in bold past 1.15x. The last column: the rate of one stream "
           "connect's probes measured (the median over the runs), against what the bed carries "
           "(the forced ring's busbw at the largest size; the simulator's link).", ""]
    out.append("| bed, world, hop | " + " | ".join(size(b) for b in sizes)
               + " | probe / carried (B/us) |")
    out.append("|---|" + "---:|" * (len(sizes) + 1))
    beds = {"relay": 0, "loopback": 1, "simulator": 2}
    keys = sorted({(r["bed"], int(r["world"]), r["delay_us"]) for r in rows},
                  key=lambda k: (beds[k[0]], k[1], int(k[2] or 0)))
    for bed, world, delay in keys:
        hop = f"{delay} us" if delay else "loopback"
        row = [f"{bed}, {world}, {hop}"]
        for b in sizes:
            key = (bed, str(world), delay)
            auto = cells.get(key + ("auto", str(b)))
            forced = [(cells.get(key + (p, str(b))), p) for p in ("ring", "gather", "bruck", "index")
                      if carries(p, world, b) and cells.get(key + (p, str(b)))]
            if not auto or not forced:
                row.append("")
                continue
            best, name = min(forced)
            ratio = f"{auto / best:.2f}x"
            row.append(f"{duration(auto)} / {duration(best)} {name} "
                       + (f"(**{ratio}**)" if auto / best > 1.15 else f"({ratio})"))
        rate = probed.get((bed, str(world), delay))
        if bed == "simulator":
            carried = 1250.0  # its 10 Gbit/s link
        else:
            ring = (bed, str(world), delay, "ring", str(sizes[-1]))
            busbw = [float(r["busbw_GBs"]) for r in rows
                     if (r["bed"], r["world"], r["delay_us"], r["series"], r["bytes"]) == ring]
            carried = statistics.median(busbw) * 1000 if busbw else None
        row.append(f"{rate:.0f} / {carried:.0f}" if rate and carried else "")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def channels():
    _, rows = load("channels")
    out = [source("channels", rows, "ranks as threads on the relay and CPU parts, one process "
                  "per rank on the small calls"), ""]
    part = lambda name: [r for r in rows if r["part"] == name]
    relay = {s: median(v, "busbw_GBs") for (s,), v in group(part("relay"), "series").items()}
    cpu = {s: median(v, "cpu_us") for (s,), v in group(part("cpu"), "series").items()}
    out.append("| 16 MiB, world 4 | C = 1 | C = 4 | C = 4 / C = 1 |")
    out.append("|---|---:|---:|---:|")
    if relay.get("c1") and relay.get("c4"):
        out.append(f"| relay, each stream capped at 250 Mbit/s: busbw (GB/s) | {relay['c1']:.4f} | "
                   f"{relay['c4']:.4f} | {relay['c4'] / relay['c1']:.2f}x |")
    if cpu.get("c1") and cpu.get("c4"):
        out.append(f"| loopback: CPU per call, summed over ranks | {duration(cpu['c1'])} | "
                   f"{duration(cpu['c4'])} | {cpu['c4'] / cpu['c1']:.2f}x |")
    smalls = sorted({r["part"] for r in rows if r["part"].startswith("small-w")})
    for name in smalls:
        world = name.removeprefix("small-w")
        cells = {k: median(v, "median_us") for k, v in group(part(name), "series", "bytes").items()}
        out += ["", f"Loopback, world {world}, one process per rank: the median time of a call "
                "before channels and with them (chosen), and the second over the first.", ""]
        out.append("| size | before channels | with channels | ratio |")
        out.append("|---|---:|---:|---:|")
        for b in sorted({int(r["bytes"]) for r in part(name)}):
            base, ours = cells.get(("base", str(b))), cells.get(("channels", str(b)))
            ratio = f"{ours / base:.2f}x" if ours and base else ""
            out.append(f"| {size(b)} | {duration(base)} | {duration(ours)} | {ratio} |")
    return "\n".join(out) + "\n"


RENDERS = {"loopback": loopback, "relay": relay, "netns": netns, "simulator": simulator,
           "fixed": fixed, "paths": paths, "cut": cut, "channels": channels}


def busbw_plot():
    """busbw against size on loopback, one panel per world, one line per implementation."""
    _, rows = load("loopback")
    worlds = sorted({int(r["world"]) for r in rows})
    series = [s for s in NAMES if any(r["series"] == s for r in rows)]
    bw = {k: median(v, "busbw_GBs") for k, v in group(rows, "series", "world", "bytes").items()}
    top = max(v for v in bw.values() if v is not None)
    top = math.ceil(top * 2) / 2  # a gridline every 0.5 GB/s
    lo, hi = 3, 26  # log2 of 8 B and 64 MiB
    pw, ph, left, gap, upper = 300, 220, 50, 50, 40
    width = left + len(worlds) * (pw + gap) + 10
    height = upper + ph + 80
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">busbw (GB/s) against size, f64 sum, loopback, '
           f'one process per rank (docs/results/loopback.csv)</text>']
    for i, world in enumerate(worlds):
        x0 = left + i * (pw + gap)
        y0 = upper + ph

        def x(b):
            return x0 + (math.log2(b) - lo) / (hi - lo) * pw

        def y(v):
            return y0 - v / top * ph

        out.append(f'<text x="{x0 + pw / 2:.1f}" y="{upper - 6}" text-anchor="middle">world '
                   f'{world}</text>')
        out.append(f'<rect x="{x0}" y="{upper}" width="{pw}" height="{ph}" fill="none" '
                   f'stroke="#888"/>')
        steps = int(round(top / 0.5))
        for k in range(steps + 1):
            v = k * 0.5
            out.append(f'<line x1="{x0}" y1="{y(v):.1f}" x2="{x0 + pw}" y2="{y(v):.1f}" '
                       f'stroke="#ddd"/>')
            if i == 0:
                out.append(f'<text x="{x0 - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                           f'{v:.1f}</text>')
        for b in (8, 4096, 2 << 20, 64 << 20):
            out.append(f'<text x="{x(b):.1f}" y="{y0 + 16}" text-anchor="middle">{size(b)}'
                       f'</text>')
        for s in series:
            points = sorted((int(k[2]), v) for k, v in bw.items()
                            if k[0] == s and k[1] == str(world) and v is not None)
            path = " ".join(f"{x(b):.1f},{y(v):.1f}" for b, v in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{COLOURS[s]}" '
                       f'stroke-width="2"/>')
    for j, s in enumerate(series):
        lx = left + j * 130
        ly = upper + ph + 45
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{COLOURS[s]}" '
                   f'stroke-width="3"/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{NAMES[s]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


PLOTS = {"busbw-loopback.svg": busbw_plot}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page or plot differs from its render")
    args = parser.parse_args()
    drift, seen = [], set()
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")

        def render(match):
            name = match.group(2)
            if name not in RENDERS:
                drift.append(f"{page.relative_to(ROOT)}: no render named {name}")
                return match.group(0)
            seen.add(name)
            return match.group(1) + RENDERS[name]() + match.group(4)

        new = MARKER.sub(render, text)
        if new != text:
            drift.append(f"{page.relative_to(ROOT)}: its tables differ from the results files")
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for name, plot in PLOTS.items():
        path = RESULTS / name
        svg = plot()
        if not path.exists() or path.read_text(encoding="utf-8") != svg:
            drift.append(f"{path.relative_to(ROOT)}: differs from its render")
            if not args.check:
                path.write_text(svg, encoding="utf-8")
    for name in sorted(set(RENDERS) - seen):
        drift.append(f"no page shows the table {name}")
    if args.check:
        for line in drift:
            print(line)
        print(f"{len(drift)} differences between the pages and the results files")
        return 1 if drift else 0
    for line in drift:
        print(f"rendered: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
