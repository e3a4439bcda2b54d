//! The simulated sweep: `--simulate`'s rows, one simulated call per kind and size, printed as
//! the measured sweep prints its own ([`crate::report`]). The flags and the model are
//! [`crate::simulate`]'s.

use silvic_net::simulate::{self, Simulated};

use crate::cli::Config;
use crate::failure::Failure;
use crate::report::{Printer, Row};
use crate::simulate::{Simulation, per_rank};
use crate::timing::Measured;
use crate::workload::Kind;

/// The time column of a simulated table.
const SIMULATED_TIME: &str = "simulated (a model, not a measurement): every rank starts the call \
     at once, until the last rank is done";

/// The preamble of a simulated run on `ring`.
fn describe(config: &Config, sim: &Simulation, ring: &simulate::SimulatedRing) -> String {
    let n = &sim.network;
    let rate = match ring.measured_rate() {
        Some(rate) => format!("one stream {rate} B/us"),
        None => "the rate not measured".to_string(),
    };
    format!(
        "# silvic-bench --simulate: silvic-net's plans in virtual time, world {}\n\
         # network model: hop {} us, link {} Gbit/s per rank each way, frame overhead {} us, \
         fold {} GB/s, copy {} GB/s, {}; path {}\n\
         # the probes, simulated, measured: hop {:.1} us, {rate}\n",
        config.world,
        n.hop.as_secs_f64() * 1e6,
        n.link_gbit,
        n.frame_overhead.as_secs_f64() * 1e6,
        n.fold_gbyte,
        n.copy_gbyte,
        match (n.cores, n.network_copies) {
            (Some(cores), 0) => format!("{cores} cores shared by all ranks"),
            (Some(cores), copies) => {
                format!(
                    "{cores} cores shared by all ranks and the network's {copies} copies a byte"
                )
            }
            (None, _) => "a core per rank".to_string(),
        },
        sim.path.name(),
        ring.measured_hop().as_secs_f64() * 1e6,
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
    // Every size of the sweep runs on one ring, formed (its probes simulated) once.
    let ring = simulate::SimulatedRing::form(&sim.network, config.world)
        .map_err(|e| format!("--simulate: {e}"))?;
    let preamble = describe(config, sim, &ring);
    for &kind in &config.kinds {
        printer.start(&preamble, kind, "");
        let mut rows = Vec::with_capacity(config.sizes.len());
        for (index, &size) in config.sizes.iter().enumerate() {
            printer.progress(kind, size, index, config.sizes.len());
            let (collective, bytes) = per_rank(kind, config.world, size);
            let simulated = ring
                .call(collective, bytes, sim.path)
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
    use crate::simulate::{COPY_GBYTE, FOLD_GBYTE, LINK_GBIT};
    use silvic_net::AllreducePath as Path;
    use silvic_net::simulate::CallKind;
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
        assert_eq!((sim.network.copy_gbyte, sim.network.cores), (COPY_GBYTE, None));
        assert_eq!(sim.network.network_copies, 0);
        let c = config(&["--simulate", "--cores", "2", "--copy-gbyte", "inf"]).unwrap();
        let sim = simulation(c).unwrap();
        assert_eq!((sim.network.copy_gbyte, sim.network.cores), (f64::INFINITY, Some(2)));
        let c = config(&["--simulate", "--cores", "2", "--network-copies", "3"]).unwrap();
        assert_eq!(simulation(c).unwrap().network.network_copies, 3);
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
            (&["--simulate", "--op", "allgather", "--path", "ring"], "no ring path"),
            (&["--simulate", "--op", "all", "--path", "ring"], "--op allgather"),
            (&["--simulate", "--world", "5000"], "4096"),
            (&["--simulate", "--link-gbit", "0"], "--link-gbit"),
            (&["--simulate", "--fold-gbyte", "nan"], "--fold-gbyte"),
            (&["--simulate", "--copy-gbyte", "0"], "--copy-gbyte"),
            (&["--simulate", "--copy-gbyte", "nan"], "--copy-gbyte"),
            (&["--simulate", "--cores", "0"], "--cores"),
            (&["--cores", "2"], "--simulate"),
            (&["--simulate", "--network-copies", "3"], "--cores"),
            (&["--simulate", "--cores", "2", "--network-copies", "17"], "--network-copies"),
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

    /// The preamble says what the simulated probes measured when the ring formed: on a link of
    /// 1 Gbit/s with frames and copies free, a stream's 125 B/us, and the hop the model holds
    /// with a probe frame's few bytes at that rate.
    #[test]
    fn the_preamble_gives_what_the_simulated_probes_measured() {
        let args = ["--simulate", "--world", "4", "--hop-us", "200", "--link-gbit", "1"];
        let free = ["--frame-overhead-us", "0", "--copy-gbyte", "inf"];
        let c = config(&[&args[..], &free[..]].concat()).unwrap();
        let Mode::Simulate(sim) = c.mode else { panic!("not a simulation: {:?}", c.mode) };
        let ring = simulate::SimulatedRing::form(&sim.network, c.world).unwrap();
        assert_eq!(ring.measured_rate(), Some(125));
        let preamble = describe(&c, &sim, &ring);
        let line = "# the probes, simulated, measured: hop 200.1 us, one stream 125 B/us\n";
        assert!(preamble.ends_with(line), "{preamble}");
    }

    #[test]
    fn an_allgather_row_is_the_gathered_total_of_blocks_of_size_over_world() {
        assert_eq!(per_rank(Kind::Allgather, 4, 1 << 20), (CallKind::Allgather, 1 << 18));
        assert_eq!(per_rank(Kind::MaxF64, 4, 1 << 20), (CallKind::Allreduce, 1 << 20));
        let sim = Simulated { time: Duration::from_micros(250), path: Path::Ring, frames: 9 };
        let r = row(Kind::SumF64, 4, 1 << 20, sim);
        assert_eq!(r.csv(None), "4,1048576,1,1,250.000,250.000,4.1943,6.2915,sum_f64");
    }
}
