//! Output: the nccl-tests style table, one CSV, JSON Lines, the progress line, and peak RSS.
//!
//! The CSV starts with the peer benchmarks' columns (docs/performance.md)
//! `world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs`, so silvic's rows and the
//! peers' go in one table, then adds `op` (and `link` when the link rate is known): one header
//! line for the whole run, whatever `--op`. GB is 10^9 bytes; busbw = algbw × the kind's bus
//! factor; link = busbw / the link rate.

use std::io::{IsTerminal, Write};

use serde_json::json;

use crate::cli::Format;
use crate::timing::Measured;
use crate::workload::Kind;

/// The peers' CSV columns, which the CSV starts with.
pub(crate) const PEER_COLUMNS: &str = "world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs";

/// The CSV header line: the peers' columns, `op`, and `link` when `link` is known.
pub(crate) fn csv_header(link: bool) -> String {
    format!("{PEER_COLUMNS},op{}", if link { ",link" } else { "" })
}

/// A link rate in Mbit/s as GB/s (10^9 bytes per second).
pub(crate) fn mbit_to_gbs(mbit: u64) -> f64 {
    mbit as f64 * 1e6 / 8.0 / 1e9
}

/// One line of results: a kind, a size, what was measured there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) kind: Kind,
    pub(crate) world: usize,
    pub(crate) bytes: usize,
    pub(crate) measured: Measured,
    /// Largest peak resident set over the ranks' processes, in bytes, where known.
    pub(crate) peak_rss: Option<u64>,
}

impl Row {
    /// Bytes per second of buffer, in GB/s.
    pub(crate) fn algbw(&self) -> f64 {
        if self.measured.median > 0.0 {
            self.bytes as f64 / self.measured.median / 1e9
        } else {
            0.0
        }
    }

    /// algbw × the bus factor: what each rank's link carried, comparable across world sizes.
    pub(crate) fn busbw(&self) -> f64 {
        self.algbw() * self.kind.bus_factor(self.world)
    }

    /// busbw as a share of `link` GB/s.
    pub(crate) fn link_share(&self, link: f64) -> f64 {
        self.busbw() / link
    }

    /// The row in the CSV (see [`csv_header`]); `link` is the link rate in GB/s, if known.
    pub(crate) fn csv(&self, link: Option<f64>) -> String {
        let m = &self.measured;
        let share = link.map_or(String::new(), |l| format!(",{:.4}", self.link_share(l)));
        format!(
            "{},{},{},{},{:.3},{:.3},{:.4},{:.4},{}{share}",
            self.world,
            self.bytes,
            m.iters,
            m.reps,
            m.median * 1e6,
            m.min * 1e6,
            self.algbw(),
            self.busbw(),
            self.kind.name(),
        )
    }

    /// The row as one JSON object; `link` is the link rate in GB/s, if known. Unknown values
    /// are null.
    pub(crate) fn json(&self, link: Option<f64>) -> String {
        let m = &self.measured;
        json!({
            "op": self.kind.name(),
            "in_place": self.kind.in_place(),
            "world": self.world,
            "bytes": self.bytes,
            "iters": m.iters,
            "reps": m.reps,
            "median_us": m.median * 1e6,
            "min_us": m.min * 1e6,
            "algbw_GBs": self.algbw(),
            "busbw_GBs": self.busbw(),
            "link": link.map(|l| self.link_share(l)),
            "link_GBs": link,
            "peak_rss_bytes": self.peak_rss,
            "wrong": m.wrong,
            "cpu_us": m.cpu.map(|c| c * 1e6),
        })
        .to_string()
    }

    /// The row in the table; `cpu` adds the CPU time column, `link` (GB/s) the link column.
    pub(crate) fn table(&self, cpu: bool, link: Option<f64>) -> String {
        let rss = self.peak_rss.map_or("-".to_string(), |b| format!("{:.1}", b as f64 / MIB));
        let wrong = self.measured.wrong.map_or("-".to_string(), |w| w.to_string());
        let cpu = if cpu {
            format!(
                " {:>10}",
                self.measured.cpu.map_or("-".to_string(), |c| format!("{:.2}", c * 1e6))
            )
        } else {
            String::new()
        };
        let link = link.map_or(String::new(), |l| format!(" {:>7.3}", self.link_share(l)));
        format!(
            "{:>12} {:>12} {:>7} {:>6} {:>11.2} {:>7.3} {:>7.3} {:>10} {:>7}{cpu}{link}",
            self.bytes,
            self.bytes / self.kind.element_bytes(),
            self.kind.type_name(),
            self.kind.redop(),
            self.measured.median * 1e6,
            self.algbw(),
            self.busbw(),
            rss,
            wrong
        )
    }
}

const MIB: f64 = (1 << 20) as f64;

/// What the time column of a measured run is.
pub(crate) const MEASURED_TIME: &str = "median over repetitions of the slowest rank's time per \
     call (median of per-repetition maxima)";

/// The header lines of a kind's table: what a call does to its buffer and which statistic the
/// time is (`time`), then the column names and units. `cpu` adds the CPU column, `link` the link
/// column.
pub(crate) fn table_header(kind: Kind, time: &str, rss_per: &str, cpu: bool, link: bool) -> String {
    let (mut name, mut unit) = if cpu {
        (format!(" {:>10}", "cpu/call"), format!(" {:>10}", "(us)"))
    } else {
        (String::new(), String::new())
    };
    if link {
        name += &format!(" {:>7}", "link");
        unit += &format!(" {:>7}", "(share)");
    }
    let place = if kind.in_place() {
        "in place (each call reduces the buffer it is given)"
    } else {
        "out of place (each call returns new blocks)"
    };
    format!(
        "# {}, {place}\n\
         # time: {time}\n\
         #{:>11} {:>12} {:>7} {:>6} {:>11} {:>7} {:>7} {:>10} {:>7}{name}\n#{:>11} {:>12} {:>7} {:>6} {:>11} {:>7} {:>7} {:>10} {:>7}{unit}",
        kind.name(),
        "size",
        "count",
        "type",
        "redop",
        "time",
        "algbw",
        "busbw",
        "peak RSS",
        "#wrong",
        "(B)",
        "(elements)",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        rss_per,
        ""
    )
}

/// A size in the largest binary unit that divides it: "64 MiB", "4 KiB", "8 B".
pub(crate) fn human(bytes: usize) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// Peak resident set of this process so far (`VmHWM`), in bytes; `None` where /proc has none.
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 =
        line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Prints what rank 0 reports: the table, CSV or JSON on stdout, progress on stderr.
#[derive(Debug)]
pub(crate) struct Printer {
    format: Format,
    cpu: bool,
    /// The link rate in GB/s, if known.
    link: Option<f64>,
    progress: bool,
    tty: bool,
    /// Whether a progress line is on screen and must be cleared.
    shown: bool,
    /// Whether the preamble is out (it is printed once, before the first kind).
    started: bool,
    /// What the time column is.
    time: &'static str,
}

impl Printer {
    /// A printer for rank 0; `progress` turns the progress line on, `cpu` the CPU column and
    /// `link_mbit` the link column.
    pub(crate) fn new(
        format: Format,
        progress: bool,
        cpu: bool,
        link_mbit: Option<u64>,
    ) -> Printer {
        Printer {
            format,
            cpu,
            link: link_mbit.map(mbit_to_gbs),
            progress,
            tty: std::io::stderr().is_terminal(),
            shown: false,
            started: false,
            time: MEASURED_TIME,
        }
    }

    /// The same printer for times that `time` describes instead of measured ones.
    pub(crate) fn timed_as(self, time: &'static str) -> Printer {
        Printer { time, ..self }
    }

    /// Announces the sweep of one kind.
    pub(crate) fn start(&mut self, preamble: &str, kind: Kind, rss_per: &str) {
        let mut out = std::io::stdout().lock();
        let first = !std::mem::replace(&mut self.started, true);
        match self.format {
            Format::Csv if first => {
                let _ = writeln!(out, "{}", csv_header(self.link.is_some()));
            }
            Format::Csv | Format::Json => {}
            Format::Table => {
                let _ = writeln!(
                    out,
                    "{}#\n{}",
                    if first { preamble } else { "" },
                    table_header(kind, self.time, rss_per, self.cpu, self.link.is_some())
                );
            }
        }
        let _ = out.flush();
    }

    /// Shows what is being measured now.
    pub(crate) fn progress(&mut self, kind: Kind, bytes: usize, index: usize, count: usize) {
        if !self.progress {
            return;
        }
        let line = format!("[{}/{}] {} {} ...", index + 1, count, kind.name(), human(bytes));
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            self.shown = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Prints a finished row.
    pub(crate) fn row(&mut self, row: &Row) {
        self.clear();
        let mut out = std::io::stdout().lock();
        let line = match self.format {
            Format::Csv => row.csv(self.link),
            Format::Json => row.json(self.link),
            Format::Table => row.table(self.cpu, self.link),
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Prints, in the table, the median over repetitions of `vs`'s time over `kind`'s at
    /// `elements` elements, timed in turn (`--vs`). CSV and JSON hold both rows, and no more.
    pub(crate) fn ratio(&mut self, kind: Kind, vs: Kind, elements: usize, ratio: f64) {
        if self.format != Format::Table {
            return;
        }
        self.clear();
        let (vs, kind) = (vs.name(), kind.name());
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "#   {vs} / {kind} at {elements} elements, in turn: {ratio:.3}");
        let _ = out.flush();
    }

    /// Prints the closing lines of a kind's sweep.
    pub(crate) fn finish(&mut self, rows: &[Row]) {
        self.clear();
        let wrong: u64 = rows.iter().filter_map(|r| r.measured.wrong).sum();
        if self.format != Format::Table || rows.is_empty() {
            if wrong > 0 {
                eprintln!("silvic-bench: {wrong} wrong elements");
            }
            return;
        }
        let checked = rows.iter().any(|r| r.measured.wrong.is_some());
        let average = rows.iter().map(Row::busbw).sum::<f64>() / rows.len() as f64;
        let mut out = std::io::stdout().lock();
        if checked {
            let _ = writeln!(
                out,
                "# Out of bounds values : {wrong} {}",
                if wrong == 0 { "OK" } else { "FAILED" }
            );
        }
        let _ = writeln!(out, "# Avg bus bandwidth    : {average:.3} GB/s\n#");
        let _ = out.flush();
    }

    fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: Kind, world: usize, bytes: usize, median: f64) -> Row {
        Row {
            kind,
            world,
            bytes,
            measured: Measured {
                iters: 7,
                reps: 15,
                median,
                min: median / 2.0,
                wrong: Some(0),
                cpu: Some(median * 1.5),
            },
            peak_rss: Some(3 << 20),
        }
    }

    #[test]
    fn csv_starts_with_the_peers_columns_then_op_and_link() {
        let r = row(Kind::SumF64, 4, 16 << 20, 0.01);
        assert_eq!(r.csv(None), "4,16777216,7,15,10000.000,5000.000,1.6777,2.5166,sum_f64");
        assert_eq!(csv_header(false).split(',').count(), r.csv(None).split(',').count());
        assert!(csv_header(false).starts_with(PEER_COLUMNS));
        let g = row(Kind::Allgather, 4, 4000, 1e-6);
        assert_eq!(g.csv(None), "4,4000,7,15,1.000,0.500,4.0000,3.0000,allgather");
        // 2.5166 GB/s of busbw over a 10 Gbit/s (1.25 GB/s) link.
        assert_eq!(mbit_to_gbs(10_000), 1.25);
        assert!(r.csv(Some(1.25)).ends_with(",sum_f64,2.0133"), "{}", r.csv(Some(1.25)));
        assert_eq!(csv_header(true).split(',').count(), r.csv(Some(1.25)).split(',').count());
    }

    #[test]
    fn json_rows_are_objects_with_every_field() {
        let r = row(Kind::MaxF64, 4, 2_000_000_000, 1.0);
        let v: serde_json::Value = serde_json::from_str(&r.json(Some(1.5))).unwrap();
        assert_eq!(v["op"], "max_f64");
        assert_eq!(v["in_place"], true);
        assert_eq!(v["world"], 4);
        assert_eq!(v["busbw_GBs"], 3.0);
        assert_eq!(v["link"], 2.0);
        assert_eq!(v["peak_rss_bytes"], 3 << 20);
        assert_eq!(v["wrong"], 0);
        let mut unknown = row(Kind::Allgather, 2, 64, 1e-5);
        unknown.measured.cpu = None;
        let v: serde_json::Value = serde_json::from_str(&unknown.json(None)).unwrap();
        assert!(v["link"].is_null() && v["cpu_us"].is_null(), "{v}");
        assert_eq!(v["in_place"], false);
    }

    #[test]
    fn bandwidths_follow_nccl_tests() {
        let r = row(Kind::SumF64, 2, 1_000_000_000, 1.0);
        assert_eq!((r.algbw(), r.busbw()), (1.0, 1.0));
        let r = row(Kind::MaxF64, 4, 2_000_000_000, 1.0);
        assert_eq!((r.algbw(), r.busbw()), (2.0, 3.0));
        assert_eq!(row(Kind::SumI64, 4, 8, 0.0).algbw(), 0.0);
    }

    #[test]
    fn table_rows_line_up_with_the_header() {
        for cpu in [false, true] {
            for link in [None, Some(0.125)] {
                let header =
                    table_header(Kind::SumF64, MEASURED_TIME, "(MiB)", cpu, link.is_some());
                let lines: Vec<&str> = header.lines().collect();
                assert!(lines[0].contains("in place"), "{header}");
                assert!(lines[1].contains("median of per-repetition maxima"), "{header}");
                let r = row(Kind::SumF64, 4, 64 << 20, 0.1).table(cpu, link);
                for line in &lines[2..] {
                    assert_eq!(line.len(), r.len(), "{line:?} vs {r:?}");
                }
                assert_eq!(r.contains("150000.00"), cpu, "{r}");
                // 64 MiB in 0.1 s at world 4: busbw 1.007 GB/s, 8.053 times a 1 Gbit/s link.
                assert_eq!(r.contains("8.053"), link.is_some(), "{r}");
            }
        }
        assert!(
            table_header(Kind::Allgather, MEASURED_TIME, "", false, false).contains("out of place")
        );
        let r = row(Kind::SumF64, 4, 64 << 20, 0.1).table(false, None);
        assert!(r.contains("8388608") && r.contains("double") && r.contains("3.0"), "{r}");
        let mut unchecked = row(Kind::Allgather, 2, 64, 1e-5);
        unchecked.measured.wrong = None;
        unchecked.peak_rss = None;
        let t = unchecked.table(false, None);
        assert!(t.contains("uint8") && t.contains("none") && t.trim_end().ends_with('-'), "{t}");
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(8), "8 B");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1000), "1000 B");
    }

    #[test]
    fn peak_rss_comes_from_vm_hwm() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(1234 * 1024));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM: lots kB\n"), None);
        if cfg!(target_os = "linux") {
            assert!(peak_rss().unwrap() > 0);
        }
    }
}
