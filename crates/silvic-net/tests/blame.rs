//! Who hears a failure, and whom it blames: ranks as threads on loopback.
//!
//! - A failure reaches a rank from its right neighbour (the reverse direction) while that rank
//!   waits on its left for data, long before its own timeout.
//! - A rank that stops calling is named by every other rank's error (`peer()`), whether the
//!   rank timed out on it or only waited on a rank that did; with two stalled ranks, every
//!   error names one of them, never a rank that was only waiting, and a rank that times out
//!   itself names the stalled neighbour it waited on.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::ring_of_threads;
use silvic_net::{Collective, CollectiveError, TcpCollective};

const LIMIT: Duration = Duration::from_secs(60);

/// The error a rank ends with, and how long its failing call took.
type Outcome = Option<(CollectiveError, Duration)>;

/// Runs `world` ranks: the ranks in `stalled` never call (they hold their ring until every other
/// rank has failed, so their sockets stay open); every other rank calls one allreduce with
/// `timeout`, whose error it returns. Rank `odd`, if any, calls another op.
fn ring_with_stalled(
    world: usize,
    stalled: &'static [usize],
    odd: Option<usize>,
    timeout: Duration,
) -> Vec<Outcome> {
    // Every rank meets here once the calling ranks have failed: a stalled rank keeps its ring
    // open until then. (A rank that hangs fails the test through ring_of_threads' limit.)
    let all_failed = Arc::new(Barrier::new(world));
    ring_of_threads(world, LIMIT, move |rank, mut ring: TcpCollective| {
        ring.set_timeout(timeout);
        if stalled.contains(&rank) {
            all_failed.wait();
            return None;
        }
        let mut buf = vec![1.0; 100_000];
        let t = Instant::now();
        let error = if odd == Some(rank) {
            ring.allreduce_max_f64(&mut buf).unwrap_err()
        } else {
            ring.allreduce_sum_f64(&mut buf).unwrap_err()
        };
        let took = t.elapsed();
        all_failed.wait();
        Some((error, took))
    })
}

#[test]
fn an_abort_from_the_right_reaches_a_rank_waiting_on_its_left() {
    // Rank 3 never calls. Rank 1 calls another op, so rank 2 fails at once, out of step. Rank 0
    // waits on rank 3 for data: only the abort coming back from rank 1 can tell it, well inside
    // its one-minute timeout.
    let timeout = Duration::from_secs(60);
    let results = ring_with_stalled(4, &[3], Some(1), timeout);
    for rank in [0, 1, 2] {
        let (error, took) = results[rank].clone().unwrap();
        // Ranks 1 and 2 both read a frame of the other op: either may fail first. A rank told
        // that it is the one out of step names the rank that told it (never itself).
        let cause = match &error {
            CollectiveError::Aborted { origin: 1 | 2, cause } => &**cause,
            other => other,
        };
        assert!(
            matches!(cause, CollectiveError::OutOfStep { peer: 0..=2, .. }),
            "rank {rank}: {error}"
        );
        assert_ne!(error.peer(), Some(rank), "rank {rank} names itself: {error}");
        assert!(took < timeout / 2, "rank {rank} heard only after {took:?}: {error}");
    }
}

#[test]
fn a_rank_that_stops_calling_is_blamed_by_every_rank() {
    let timeout = Duration::from_millis(1500);
    let results = ring_with_stalled(5, &[2], None, timeout);
    // A neighbour that waited on it timed out naming it: its right neighbour, waiting for its
    // data, or its left one, whose frame it stopped reading (the two wait from about the same
    // moment, so either may time out first and tell the other).
    let timed_out = |rank: usize| {
        results[rank].clone().unwrap().0 == CollectiveError::Timeout { peer: 2, waited: timeout }
    };
    assert!(timed_out(3) || timed_out(1), "{results:?}");
    for (rank, outcome) in results.iter().enumerate() {
        let Some((error, took)) = outcome else { continue };
        assert_eq!(error.peer(), Some(2), "rank {rank} blamed another rank: {error}");
        let cause = match error {
            CollectiveError::Aborted { cause, .. } => &**cause,
            other => other,
        };
        assert!(matches!(cause, CollectiveError::Timeout { peer: 2, .. }), "rank {rank}: {error}");
        // Nobody times out on a stalled rank before the timeout (a rank that hears of it
        // through an abort may do so sooner after its own call began).
        if let CollectiveError::Timeout { .. } = error {
            assert!(*took >= timeout, "rank {rank} timed out after only {took:?}");
        }
    }
}

#[test]
fn with_two_stalled_ranks_every_error_names_one_of_them() {
    let timeout = Duration::from_millis(1000);
    let results = ring_with_stalled(6, &[1, 4], None, timeout);
    let mut timed_out = 0;
    for (rank, outcome) in results.iter().enumerate() {
        let Some((error, took)) = outcome else { continue };
        let peer = error.peer();
        assert!(matches!(peer, Some(1 | 4)), "rank {rank} blamed a rank that was waiting: {error}");
        // A rank whose own timeout fired names the neighbour that went silent on it: a stalled
        // one, since every waiting rank sends notices. Any rank may instead hear first of the
        // other stalled rank through an abort (both timeouts fire about together), so which of
        // the two a rank names is a race.
        if let CollectiveError::Timeout { peer, .. } = *error {
            timed_out += 1;
            assert!(*took >= timeout, "rank {rank} timed out after only {took:?}");
            assert!(
                peer == (rank + 1) % 6 || (peer + 1) % 6 == rank,
                "rank {rank} timed out on rank {peer}, not a neighbour"
            );
        }
    }
    assert!(timed_out > 0, "nobody timed out on a stalled rank: {results:?}");
}
