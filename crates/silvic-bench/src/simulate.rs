//! `--simulate`'s flags and the network model they make (the sweep itself is
//! `simulated.rs`): the sweep's table and CSV from silvic-net's simulator
//! ([`silvic_net::simulate`]), the real plans run in virtual time through a network model,
//! instead of ranks on this host. No rank, socket or clock: the same flags print the same bytes
//! on every run, and a world of 1024 takes seconds (docs/simulator.md).
//!
//! The defaults are a loopback ring of a 2-core shared Linux VM (AMD EPYC, Linux 6.18) at
//! world 2, where each rank has a core; docs/simulator.md says how each was measured, and how
//! to measure them on another network.

use clap::Args;
use silvic_net::AllreducePath;
use silvic_net::simulate::{self, CallKind, NetworkModel};

use crate::workload::{Kind, Workload};

/// A hop's latency by default, in us.
pub(crate) const HOP_US: f64 = 5.0;
/// Each rank's link rate by default, in Gbit/s.
pub(crate) const LINK_GBIT: f64 = 72.0;
/// A frame's overhead by default, in us.
pub(crate) const FRAME_OVERHEAD_US: f64 = 1.5;
/// The fold's rate by default, in GB/s.
pub(crate) const FOLD_GBYTE: f64 = 10.0;
/// The copy's rate by default, in GB/s.
pub(crate) const COPY_GBYTE: f64 = 20.0;

/// The simulator's flags.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Simulate the calls instead of running them: silvic-net's real plans in virtual time
    /// through a model of a network (--hop-us, --link-gbit, --frame-overhead-us,
    /// --fold-gbyte, --copy-gbyte, --cores, --network-copies), for any --world up to 4096.
    /// Prints the same table, CSV or JSON, the same on every run. The defaults were measured on
    /// the loopback ring of a 2-core shared Linux VM at world 2, a core per rank: an 8-byte call
    /// took 6.5 us (5 of hop, 1.5 of frame overhead), the f64 fold into 64 MiB gave the fold
    /// rate, 256 KiB copies out of 64 MiB the copy rate, and 32 KiB against 256 KiB calls, less
    /// a fold and two copies per byte, the link rate. docs/simulator.md says how, how to measure
    /// another network, and the flags that model the relay bed.
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

    /// With --simulate: the rate a rank's core copies a frame's bytes out to its link and in
    /// from it, in GB/s (each frame costs its sender and its receiver bytes / rate of CPU; inf:
    /// copies cost nothing).
    #[arg(long, requires = "simulate", default_value_t = COPY_GBYTE)]
    pub(crate) copy_gbyte: f64,

    /// With --simulate: the cores all ranks share for their copies and folds, as ranks on one
    /// host do (the relay bed: 2) [default: a core per rank, a host per rank].
    #[arg(long, requires = "simulate", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) cores: Option<u32>,

    /// With --simulate and --cores: the copies of each byte the network itself makes on the
    /// shared cores, at the copy rate, holding no rank's thread (the relay bed's relays: 3).
    #[arg(
        long,
        requires = "cores",
        default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=16)
    )]
    pub(crate) network_copies: u32,

    /// The path of every allreduce: auto (what the real call chooses), or gather, ring, bruck
    /// or index, forced. On every run: with --simulate the simulated calls take it; else the
    /// ring connects forcing it (threads, the relay bed of --link-delay-us, processes, --rank,
    /// --netns-hosts), as SILVIC_ALLREDUCE does, and a call the path cannot carry (bruck and
    /// index without chord streams, below 8 ranks; gather and bruck past the gather's memory
    /// bound) takes the automatic path. Allgathers choose their own.
    #[arg(long, default_value = "auto", value_parser = parse_path)]
    pub(crate) path: AllreducePath,
}

fn parse_path(s: &str) -> Result<AllreducePath, String> {
    s.parse().map_err(|e: silvic_net::ConnectError| e.to_string())
}

/// A checked simulation: the network and the path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Simulation {
    pub(crate) network: NetworkModel,
    pub(crate) path: AllreducePath,
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
        if self.copy_gbyte.is_nan() || self.copy_gbyte <= 0.0 {
            return Err("--copy-gbyte must be a positive number or inf".into());
        }
        let network = NetworkModel {
            hop: time("hop-us", self.hop_us)?,
            link_gbit: self.link_gbit,
            frame_overhead: time("frame-overhead-us", self.frame_overhead_us)?,
            fold_gbyte: self.fold_gbyte,
            copy_gbyte: self.copy_gbyte,
            cores: self.cores.map(|c| c as usize),
            network_copies: self.network_copies,
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
pub(crate) fn per_rank(kind: Kind, world: usize, size: usize) -> (CallKind, usize) {
    match kind {
        Kind::Allgather => (CallKind::Allgather, Workload::elements(kind, world, size)),
        _ => (CallKind::Allreduce, size),
    }
}
