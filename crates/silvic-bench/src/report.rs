//! Output: the nccl-tests style table, the peers' CSV, the progress line, and peak RSS.
//!
//! The CSV is exactly `../shared/peers/README.md`'s
//! `world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs`, so silvic's rows and the
//! peers' go in one table. GB is 10^9 bytes; busbw = algbw × the kind's bus factor.

use std::io::{IsTerminal, Write};

use crate::timing::Measured;
use crate::workload::Kind;

/// The CSV header line of the peers' scripts.
pub(crate) const CSV_HEADER: &str = "world,bytes,iters,reps,median_us,min_us,algbw_GBs,busbw_GBs";

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

    /// The row in the peers' CSV format.
    pub(crate) fn csv(&self) -> String {
        let m = &self.measured;
        format!(
            "{},{},{},{},{:.3},{:.3},{:.4},{:.4}",
            self.world,
            self.bytes,
            m.iters,
            m.reps,
            m.median * 1e6,
            m.min * 1e6,
            self.algbw(),
            self.busbw()
        )
    }

    /// The row in the table; `cpu` adds the CPU time column.
    pub(crate) fn table(&self, cpu: bool) -> String {
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
        format!(
            "{:>12} {:>12} {:>7} {:>6} {:>11.2} {:>7.3} {:>7.3} {:>10} {:>7}{cpu}",
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

/// The two header lines of the table (column names, then units); `cpu` adds the CPU column.
pub(crate) fn table_header(rss_per: &str, cpu: bool) -> String {
    let (name, unit) = if cpu {
        (format!(" {:>10}", "cpu/call"), format!(" {:>10}", "(us)"))
    } else {
        (String::new(), String::new())
    };
    format!(
        "#{:>11} {:>12} {:>7} {:>6} {:>11} {:>7} {:>7} {:>10} {:>7}{name}\n#{:>11} {:>12} {:>7} {:>6} {:>11} {:>7} {:>7} {:>10} {:>7}{unit}",
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

/// Prints what rank 0 reports: the table or the CSV on stdout, progress on stderr.
#[derive(Debug)]
pub(crate) struct Printer {
    csv: bool,
    cpu: bool,
    progress: bool,
    tty: bool,
    /// Whether a progress line is on screen and must be cleared.
    shown: bool,
    /// Whether the preamble is out (it is printed once, before the first kind).
    started: bool,
}

impl Printer {
    /// A printer for rank 0; `progress` turns the progress line on, `cpu` the CPU column.
    pub(crate) fn new(csv: bool, progress: bool, cpu: bool) -> Printer {
        Printer {
            csv,
            cpu,
            progress,
            tty: std::io::stderr().is_terminal(),
            shown: false,
            started: false,
        }
    }

    /// Announces the sweep of one kind.
    pub(crate) fn start(&mut self, preamble: &str, kind: Kind, rss_per: &str) {
        let mut out = std::io::stdout().lock();
        let first = !std::mem::replace(&mut self.started, true);
        if self.csv {
            let _ = writeln!(out, "# {}\n{CSV_HEADER}", kind.name());
        } else {
            let _ = writeln!(
                out,
                "{}#\n# {}\n{}",
                if first { preamble } else { "" },
                kind.name(),
                table_header(rss_per, self.cpu)
            );
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
        let _ = writeln!(out, "{}", if self.csv { row.csv() } else { row.table(self.cpu) });
        let _ = out.flush();
    }

    /// Prints the closing lines of a kind's sweep.
    pub(crate) fn finish(&mut self, rows: &[Row]) {
        self.clear();
        let wrong: u64 = rows.iter().filter_map(|r| r.measured.wrong).sum();
        if self.csv || rows.is_empty() {
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
    fn csv_matches_the_peers_format() {
        let r = row(Kind::SumF64, 4, 16 << 20, 0.01);
        assert_eq!(r.csv(), "4,16777216,7,15,10000.000,5000.000,1.6777,2.5166");
        assert_eq!(CSV_HEADER.split(',').count(), r.csv().split(',').count());
        let g = row(Kind::Allgather, 4, 4000, 1e-6);
        assert_eq!(g.csv(), "4,4000,7,15,1.000,0.500,4.0000,3.0000");
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
            let header = table_header("(MiB)", cpu);
            let r = row(Kind::SumF64, 4, 64 << 20, 0.1).table(cpu);
            for line in header.lines() {
                assert_eq!(line.len(), r.len(), "{line:?} vs {r:?}");
            }
            assert_eq!(r.contains("150000.00"), cpu, "{r}");
        }
        let r = row(Kind::SumF64, 4, 64 << 20, 0.1).table(false);
        assert!(r.contains("8388608") && r.contains("double") && r.contains("3.0"), "{r}");
        let mut unchecked = row(Kind::Allgather, 2, 64, 1e-5);
        unchecked.measured.wrong = None;
        unchecked.peak_rss = None;
        let t = unchecked.table(false);
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
