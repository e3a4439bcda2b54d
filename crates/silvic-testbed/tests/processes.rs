//! Ranks as separate processes on loopback (no privileges needed): hundreds of mixed collectives
//! verified on every rank, a rank killed mid-allreduce, a rank stopped mid-allreduce.
//!
//! The ranks are the test bed's rank processes ([`World`] with no network): every wait is
//! bounded, and the processes are killed when the world drops, so a hang is a failure and never
//! a stuck run.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use silvic_testbed::MARGIN;
use silvic_testbed::ring::{End, Layout, World};

const WORLD: usize = 4;

fn start(args: &[&str]) -> World {
    let exe = Path::new(env!("CARGO_BIN_EXE_silvic-testbed"));
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    World::start(exe, WORLD, None, &Layout::default(), &args, |_| vec![])
        .unwrap_or_else(|e| panic!("start: {e}"))
}

#[test]
fn four_processes_run_hundreds_of_mixed_collectives() {
    let mut world = start(&["workload=sweep", "count=320", "timeout=60", "report=40"]);
    let ends = world.ends(Instant::now() + Duration::from_secs(180));
    for (rank, (end, line)) in ends.iter().enumerate() {
        assert_eq!(end, &End::Done, "rank {rank}: {line:?}");
    }
}

/// 16 MiB allreduces back to back, with a collective timeout of `timeout` seconds.
fn big_loop(timeout: &str) -> World {
    let mut world = start(&["kind=sum_f64", "bytes=16777216", "count=1000000", timeout]);
    let warm = Instant::now() + Duration::from_secs(120);
    world.wait_oks(&[0, 1, 2, 3], 2, warm).unwrap_or_else(|e| panic!("warm-up: {e}"));
    world
}

/// The failure `rank` reports by `deadline`: the peer it names, the error's kind and message,
/// and when the line came. Panics if the rank ended otherwise or not at all.
fn failure(
    world: &mut World,
    rank: usize,
    deadline: Instant,
) -> (Option<usize>, String, String, Instant) {
    let line = world.ranks[rank].wait_for(&["DONE", "ERR", "WRONG"], deadline).unwrap();
    match End::parse(&line.text) {
        End::Failed { peer, kind, message } => (peer, kind, message, line.at),
        _ => panic!("rank {rank} did not fail: {}", line.text),
    }
}

#[test]
fn a_rank_killed_mid_allreduce_fails_every_survivor_without_waiting_for_a_timeout() {
    let timeout = Duration::from_secs(60);
    let mut world = big_loop("timeout=60");
    world.ranks[2].signal(Signal::KILL).unwrap();
    let killed = Instant::now();
    // Within the timeout: a survivor that did not hear the close would time out instead.
    let deadline = killed + timeout + MARGIN;
    for rank in [0, 1, 3] {
        let (peer, kind, message, at) = failure(&mut world, rank, deadline);
        assert_eq!(peer, Some(2), "rank {rank} named another peer: {message}");
        assert_ne!(kind, "timeout", "rank {rank} timed out instead of hearing the close");
        let after = at.saturating_duration_since(killed);
        eprintln!("rank {rank} failed {after:?} after the kill: {message}");
        assert!(after < timeout, "rank {rank} failed after {after:?}: {message}");
    }
}

#[test]
fn a_stopped_rank_fails_every_survivor_after_the_timeout() {
    let timeout = Duration::from_secs(3);
    let mut world = big_loop("timeout=3");
    world.ranks[1].signal(Signal::STOP).unwrap();
    let stopped = Instant::now();
    // Every wait is on a stalled peer: rank 2 waits on rank 1, rank 3 on rank 2, and so on
    // around the ring, so each fails within two timeouts of the stop; MARGIN bounds the rest.
    let deadline = stopped + 2 * timeout + MARGIN;
    for rank in [0, 2, 3] {
        let (peer, _, message, at) = failure(&mut world, rank, deadline);
        // A rank waiting on a rank that is itself waiting hears so (waiting notices) and does
        // not time out on it: every rank names rank 1, by its own timeout or by the abort of
        // the rank that timed out on it; the cause is always a timeout.
        assert_eq!(peer, Some(1), "rank {rank}: {message}");
        assert!(message.contains("no progress from rank 1"), "rank {rank}: {message}");
        // A rank may have been between collectives, or its last bytes still in flight: it
        // fails one timeout after its last progress, which is never before the stop.
        let after = at.saturating_duration_since(stopped);
        assert!(after >= timeout - Duration::from_millis(500), "rank {rank} at {after:?}");
    }
}
