//! `--simulate`: the sweep's table and CSV from silvic-net's simulator
//! ([`silvic_net::simulate`]), the real plans run in virtual time through a network model,
//! instead of ranks on this host. No rank, socket or clock: the same flags print the same bytes
//! on every run, and a world of 1024 takes seconds (docs/simulator.md).
//!
//! The defaults are a loopback ring of a 2-core shared Linux VM (AMD EPYC, Linux 6.18) at
//! world 2, where each rank has a core; docs/simulator.md says how each was measured, and how
//! to measure them on another network.

use clap::Args;
use silvic_net::simulate::{self, Collective, Network, Path, Simulated};

use crate::cli::Config;
use crate::failure::Failure;
use crate::report::{Printer, Row};
use crate::timing::Measured;
use crate::workload::{Kind, Workload};

/// A hop's latency by default, in us.
pub(crate) const HOP_US: f64 = 5.0;
/// Each rank's link rate by default, in Gbit/s.
pub(crate) const LINK_GBIT: f64 = 38.0;
/// A frame's overhead by default, in us.
pub(crate) const FRAME_OVERHEAD_US: f64 = 1.5;
/// The fold's rate by default, in GB/s.
pub(crate) const FOLD_GBYTE: f64 = 10.0;

/// The time column of a simulated table.
const SIMULATED_TIME: &str = "simulated (a model, not a measurement): every rank starts the call \
     at once, until the last rank is done";

/// The simulator's flags.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Simulate the calls instead of running them: silvic-net's real plans in virtual time
    /// through a model of a network (--hop-us, --link-gbit, --frame-overhead-us,
    /// --fold-gbyte), for any --world up to 4096. Prints the same table, CSV or JSON, the same
    /// on every run. The defaults were measured on the loopback ring of a 2-core shared Linux
    /// VM at world 2, a core per rank: an 8-byte call took 6.5 us (5 of hop, 1.5 of frame
    /// overhead), 32 KiB against 256 KiB calls gave the link rate, the f64 fold into 64 MiB the
    /// fold rate. docs/simulator.md says how, and how to measure another network.
    #[arg(long, conflicts_with_all = ["netns_hosts", "link_limit", "threads", "rank", "rendezvous", "host", "listen", "link_delay_us", "cpu", "warmup"])]
    pub(crate) simulate: bool,

    /// With --simulate: a hop's one-way latency, in microseconds.
    #[arg(long, requires = "simulate", default_value_t = HOP_US)]
    pub(crate) hop_us: f64,

    /// With --simulate: each rank's link rate, each way, in Gbit/s.
    #[arg(long, requires = "simulate", default_value_t = LINK_GBIT)]
    pub(crate) link_gbit: f64,

    /// With --simulate: what each frame costs its sender beyond its bytes (header, system calls,
    /// wake-ups), in microseconds.
    #[arg(long, requires = "simulate", default_value_t = FRAME_OVERHEAD_US)]
    pub(crate) frame_overhead_us: f64,

    /// With --simulate: the rate a rank folds received bytes at, in GB/s.
    #[arg(long, requires = "simulate", default_value_t = FOLD_GBYTE)]
    pub(crate) fold_gbyte: f64,

    /// With --simulate: the path of every call where it has a choice: auto (what the real call
    /// chooses), or gather or ring (allreduce only).
    #[arg(long, requires = "simulate", default_value = "auto", value_parser = parse_path)]
    pub(crate) path: Path,
}

fn parse_path(s: &str) -> Result<Path, String> {
    s.parse()
}

/// A checked simulation: the network and the path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Simulation {
    pub(crate) network: Network,
    pub(crate) path: Path,
}

impl SimulateArgs {
    /// The simulation these flags ask for, if `--simulate`; checked against every kind and size
    /// of the sweep (an error message names what is wrong).
    pub(crate) fn simulation(
        &self,
        world: usize,
        kinds: &[Kind],
        sizes: &[usize],
    ) -> Result<Option<Simulation>, String> {
        if !self.simulate {
            return Ok(None);
        }
        let time = |name: &str, us: f64| {
            if us.is_finite() && (0.0..=1e9).contains(&us) {
                Ok(std::time::Duration::from_secs_f64(us / 1e6))
            } else {
                Err(format!("--{name} must be from 0 to 1e9 microseconds"))
            }
        };
        for (name, rate) in [("link-gbit", self.link_gbit), ("fold-gbyte", self.fold_gbyte)] {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("--{name} must be a positive number"));
            }
        }
        let network = Network {
            hop: time("hop-us", self.hop_us)?,
            link_gbit: self.link_gbit,
            frame_overhead: time("frame-overhead-us", self.frame_overhead_us)?,
            fold_gbyte: self.fold_gbyte,
        };
        for &kind in kinds {
            for &size in sizes {
                let (collective, bytes) = per_rank(kind, world, size);
                simulate::check(collective, world, bytes, self.path).map_err(|e| {
                    format!("--simulate --path {} with --op {}: {e}", self.path.name(), kind.name())
                })?;
            }
        }
        Ok(Some(Simulation { network, path: self.path }))
    }
}

/// The simulator's collective for a kind, and what each rank passes to it at `size`.
fn per_rank(kind: Kind, world: usize, size: usize) -> (Collective, usize) {
    match kind {
        Kind::Allgather => (Collective::Allgather, Workload::elements(kind, world, size)),
        _ => (Collective::Allreduce, size),
    }
}

/// The preamble of a simulated run.
fn describe(config: &Config, sim: &Simulation) -> String {
    let n = &sim.network;
    format!(
        "# silvic-bench --simulate: silvic-net's plans in virtual time, world {}\n\
         # network model: hop {} us, link {} Gbit/s per rank each way, frame overhead {} us, \
         fold {} GB/s; path {}\n",
        config.world,
        n.hop.as_secs_f64() * 1e6,
        n.link_gbit,
        n.frame_overhead.as_secs_f64() * 1e6,
        n.fold_gbyte,
        sim.path.name(),
    )
}

/// One simulated row.
fn row(kind: Kind, world: usize, size: usize, simulated: Simulated) -> Row {
    let seconds = simulated.time.as_secs_f64();
    let measured =
        Measured { iters: 1, reps: 1, median: seconds, min: seconds, wrong: None, cpu: None };
    Row { kind, world, bytes: size, measured, peak_rss: None }
}

/// Prints the simulated sweep of `config`.
pub(crate) fn run(config: &Config, sim: &Simulation) -> Result<u64, Failure> {
    let mut printer = Printer::new(config.format, config.progress, false, config.link_mbit)
        .timed_as(SIMULATED_TIME);
    let preamble = describe(config, sim);
    for &kind in &config.kinds {
        printer.start(&preamble, kind, "");
        let mut rows = Vec::with_capacity(config.sizes.len());
        for (index, &size) in config.sizes.iter().enumerate() {
            printer.progress(kind, size, index, config.sizes.len());
            let (collective, bytes) = per_rank(kind, config.world, size);
            let simulated =
                simulate::simulate(&sim.network, collective, config.world, bytes, sim.path)
                    .map_err(|e| format!("--simulate at {size} bytes: {e}"))?;
            let row = row(kind, config.world, size, simulated);
            printer.row(&row);
            rows.push(row);
        }
        printer.finish(&rows);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Mode, parse};
    use std::time::Duration;

    fn config(args: &[&str]) -> Result<Config, clap::Error> {
        parse(std::iter::once("silvic-bench").chain(args.iter().copied()))
    }

    #[test]
    fn simulate_flags_make_a_network_model_with_measured_defaults() {
        let simulation = |c: Config| match c.mode {
            Mode::Simulate(sim) => Some(sim),
            _ => None,
        };
        let c = config(&["--simulate", "--world", "1024", "--hop-us", "100"]).unwrap();
        assert_eq!(c.world, 1024);
        let sim = simulation(c).unwrap();
        assert_eq!(sim.path, Path::Auto);
        assert_eq!(sim.network.hop, Duration::from_micros(100));
        assert_eq!(sim.network.link_gbit, LINK_GBIT);
        assert_eq!(sim.network.frame_overhead, Duration::from_nanos(1500));
        assert_eq!(sim.network.fold_gbyte, FOLD_GBYTE);
        let c = config(&["--simulate", "--path", "gather", "--link-gbit", "2.5"]).unwrap();
        let sim = simulation(c).unwrap();
        assert_eq!((sim.path, sim.network.link_gbit), (Path::Gather, 2.5));
        assert_eq!(simulation(config(&[]).unwrap()), None);
    }

    #[test]
    fn a_bad_path_or_flag_is_a_usage_error_naming_it() {
        for (bad, named) in [
            (&["--simulate", "--path", "rings"][..], "rings"),
            (&["--hop-us", "5"], "--simulate"),
            (&["--path", "ring"], "--simulate"),
            (&["--simulate", "--op", "allgather", "--path", "ring"], "no ring path"),
            (&["--simulate", "--op", "all", "--path", "ring"], "--op allgather"),
            (&["--simulate", "--world", "5000"], "4096"),
            (&["--simulate", "--link-gbit", "0"], "--link-gbit"),
            (&["--simulate", "--fold-gbyte", "nan"], "--fold-gbyte"),
            (&["--simulate", "--hop-us=-1"], "--hop-us"),
            (&["--simulate", "--frame-overhead-us", "inf"], "--frame-overhead-us"),
            (&["--simulate", "--threads"], "--threads"),
            (&["--simulate", "--link-limit"], "--link-limit"),
            (&["--simulate", "--world", "1024", "--path", "gather", "--sizes", "16M"], "1 GiB"),
        ] {
            let e = config(bad).expect_err(&format!("{bad:?} should be refused"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
            assert!(e.to_string().contains(named), "{bad:?}: {e}");
        }
    }

    #[test]
    fn an_allgather_row_is_the_gathered_total_of_blocks_of_size_over_world() {
        assert_eq!(per_rank(Kind::Allgather, 4, 1 << 20), (Collective::Allgather, 1 << 18));
        assert_eq!(per_rank(Kind::MaxF64, 4, 1 << 20), (Collective::Allreduce, 1 << 20));
        let sim = Simulated { time: Duration::from_micros(250), path: Path::Ring, frames: 9 };
        let r = row(Kind::SumF64, 4, 1 << 20, sim);
        assert_eq!(r.csv(None), "4,1048576,1,1,250.000,250.000,4.1943,6.2915,sum_f64");
    }
}
