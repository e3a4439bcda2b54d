//! A 4-rank ring on loopback, one process per rank, launched the way a real launcher would.
//!
//! ```text
//! cargo run --release --example local_ring
//! ```
//!
//! Run without arguments, this program is the launcher: it starts itself four times as ranks
//! (`local_ring --rank R --world N`), reads the address each rank binds, hands every rank the
//! list in rank order, and prints what the ranks report. Each rank joins the ring, runs every
//! collective once and checks the results. Each rank logs to stderr through a tracing subscriber
//! filtered by `RUST_LOG` (warnings by default; `RUST_LOG=silvic_net=debug` for every step),
//! coloured only when stderr is a terminal.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use silvic_core::RoundedDuration;
use silvic_net::{Collective, TcpCollective};

const WORLD: usize = 4;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--rank") {
        Some(i) => match rank_main(args[i + 1].parse().expect("--rank takes a number")) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                println!("error: {error}");
                ExitCode::FAILURE
            }
        },
        None => launcher(),
    }
}

/// Starts the ranks, gathers their addresses, and relays what they print.
fn launcher() -> ExitCode {
    let exe = std::env::current_exe().expect("own path");
    let mut children: Vec<_> = (0..WORLD)
        .map(|rank| {
            Command::new(&exe)
                .args(["--rank", &rank.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut outputs: Vec<_> =
        children.iter_mut().map(|c| BufReader::new(c.stdout.take().expect("piped"))).collect();
    let addresses: Vec<String> = outputs
        .iter_mut()
        .map(|out| {
            let mut line = String::new();
            out.read_line(&mut line).expect("a rank's address");
            line.trim().to_string()
        })
        .collect();
    println!("launcher: gathered {WORLD} addresses: {}", addresses.join(", "));
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{}", addresses.join(",")).expect("hand out the addresses");
    }
    let mut ok = true;
    for (rank, (child, out)) in children.iter_mut().zip(outputs).enumerate() {
        for line in out.lines().map_while(Result::ok) {
            println!("rank {rank}: {line}");
        }
        ok &= child.wait().map(|s| s.success()).unwrap_or(false);
    }
    println!("launcher: {}", if ok { "every rank succeeded" } else { "a rank failed" });
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// One rank: bind, report the address, read everyone's, connect, run each collective.
fn rank_main(rank: usize) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpCollective::bind("127.0.0.1")?;
    println!("{}", listener.address());
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let addresses: Vec<String> = line.trim().split(',').map(String::from).collect();

    let started = Instant::now();
    let mut ring = TcpCollective::connect(
        listener,
        rank,
        &addresses,
        "local-ring-example",
        Duration::from_secs(30),
    )?;
    let joined = RoundedDuration(started.elapsed());
    println!("joined a ring of {} in {joined}", ring.world_size());

    // A histogram: bin i holds rank + i; the sum over ranks is known in closed form.
    let bins = 1 << 20;
    let mut histogram: Vec<f64> = (0..bins).map(|i| (rank + i) as f64).collect();
    let t = Instant::now();
    ring.allreduce_sum_f64(&mut histogram)?;
    let world = ring.world_size();
    let expected = |i: usize| (world * i + world * (world - 1) / 2) as f64;
    assert!(histogram.iter().enumerate().all(|(i, &x)| x == expected(i)));
    println!(
        "allreduce_sum_f64 of {bins} bins (8 MiB) in {}: bin 10 = {}",
        RoundedDuration(t.elapsed()),
        histogram[10]
    );

    let mut counts = vec![i64::MAX, rank as i64];
    ring.allreduce_sum_i64(&mut counts)?;
    println!("allreduce_sum_i64: [MAX, rank] summed = {counts:?} (the first wraps)");

    let mut best = vec![rank as f64 * 1.5, if rank == 2 { f64::NAN } else { 0.0 }];
    ring.allreduce_max_f64(&mut best)?;
    println!("allreduce_max_f64: [1.5 * rank, NaN on rank 2] = {best:?}");

    let records = ring.allgather_bytes(format!("rank {rank} here").as_bytes())?;
    let records: Vec<String> =
        records.iter().map(|r| String::from_utf8_lossy(r).into_owned()).collect();
    println!("allgather_bytes: {records:?}");
    Ok(())
}
