//! silvic-bench: measures silvic-net's collectives the way nccl-tests does.
//!
//! `cargo run --release -p silvic-bench` runs a 4-rank ring on loopback, one process per rank,
//! and prints time, algbw, busbw, peak RSS and wrong elements for f64 sums from 8 B to 64 MiB.
//! `--help` lists the flags; `--csv` prints one CSV that starts with the peers' columns
//! (docs/performance.md), so the figures go into one table with OpenMPI's, XGBoost's and Gloo's;
//! `--json` prints JSON Lines. As root, `--netns-hosts N --link-mbit R` runs the ranks on N
//! network-namespace hosts with R Mbit/s links, and `--link-limit` measures what those links
//! carry in the ring's pattern.
//!
//! Modules: [`cli`] (flags), [`rendezvous`] (where multi-host ranks meet), [`launch`]
//! (processes, threads, namespace hosts, or one rank of a multi-host run), [`sweep`] and
//! [`timing`] (the protocol), [`workload`] (inputs and checks), [`report`] (table, CSV, JSON,
//! progress, peak RSS), [`link_limit`] (the flows without the ring), [`simulate`] and
//! [`simulated`] (the plans in virtual time instead of ranks), [`failure`] (what ends a run
//! early).
//!
//! Exit codes: 0 when every result was right, 1 on wrong results or a failed run, 2 on bad flags.
#![forbid(unsafe_code)]

mod cli;
mod failure;
mod launch;
mod link_limit;
mod rendezvous;
mod report;
mod simulate;
mod simulated;
mod sizes;
mod sweep;
mod timing;
mod workload;

use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    // silvic-net's tracing events (warnings by default; RUST_LOG=silvic_net=debug for more) go to
    // stderr, apart from the table on stdout, with colour codes only where a terminal reads them
    // (not in a log file).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = match cli::parse(std::env::args_os()) {
        Ok(config) => config,
        Err(e) => e.exit(),
    };
    match launch::run(&config) {
        Ok(0) => ExitCode::SUCCESS,
        // Rank 0 has printed how many and where.
        Ok(_wrong) => ExitCode::from(1),
        Err(e) => {
            eprintln!("silvic-bench: {e}");
            ExitCode::from(1)
        }
    }
}
