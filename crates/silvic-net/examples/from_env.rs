//! One rank of a ring formed from a launcher's environment variables: what `srun`, a
//! Kubernetes indexed Job, torchrun or mpirun starts on every node.
//!
//! ```text
//! # Slurm: 4 tasks on 4 nodes, rank 0's node serves the address exchange on port 29400
//! export SILVIC_JOB_TOKEN=$(openssl rand -hex 16)
//! export SILVIC_RENDEZVOUS=tcp://$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29400
//! srun --ntasks=4 --ntasks-per-node=1 ./from_env
//! ```
//!
//! Each rank joins the ring, sums `rank + 1` across ranks, gathers every rank's host name, and
//! prints one line such as `rank 2 of 4: sum 10 (expected 10), hosts node-0,node-1,...`. It exits
//! 0 when the sum is right and 1 (printing the error) otherwise. Its one optional argument is
//! the timeout in seconds (60 by default): `./from_env 1800`.
//!
//! The library's warnings (a short job token, a refused connection, a long wait) go to stderr
//! through a tracing subscriber filtered by `RUST_LOG`: warnings by default,
//! `RUST_LOG=silvic_net=debug` for every step. They are coloured only when stderr is a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use silvic_net::{Collective, TcpCollective};

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let timeout = match std::env::args().nth(1) {
        Some(seconds) => Duration::try_from_secs_f64(seconds.parse()?)?,
        None => Duration::from_secs(60),
    };
    let mut ring = TcpCollective::from_env(timeout)?;
    let (rank, world) = (ring.rank(), ring.world_size());
    let mut sum = [rank as f64 + 1.0];
    ring.allreduce_sum_f64(&mut sum)?;
    let expected = (world * (world + 1) / 2) as f64;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hosts = ring.allgather_bytes(format!("{:<64}", host.trim()).as_bytes())?;
    let hosts: Vec<String> =
        hosts.iter().map(|h| String::from_utf8_lossy(h).trim().to_string()).collect();
    let line = format!(
        "rank {rank} of {world}: sum {} (expected {expected}), hosts {}",
        sum[0],
        hosts.join(",")
    );
    if sum[0] != expected {
        return Err(line.into());
    }
    Ok(line)
}
