//! Rings of threads on loopback split over channels (`ConnectOptions::channels`): a split call
//! gives the bits of one channel; each further channel is a named thread that exists while the
//! ring does and is gone once it is dropped; `stats()` sums the channels and `channel_stats()`
//! says each; a rank that dies mid-call ends the call on every channel of every other rank,
//! each naming it, and the error sticks.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use silvic_net::{Collective, CollectiveError, ConnectOptions, TcpCollective};

/// A bound on every ring of these tests: a hang fails the test instead.
const LIMIT: Duration = Duration::from_secs(120);

/// More than two of a channel's least shares (1 MiB), and divisible by no world or count here.
const LEN: usize = 300_007;

fn value(rank: usize, i: usize) -> f64 {
    let magnitude = if (i + rank) % 3 == 0 { 1e16 } else { 1.0 };
    ((i * 31 + rank * 17) % 101) as f64 * 0.37 * magnitude * if rank % 2 == 0 { 1.0 } else { -1.0 }
}

/// Runs `body` on every rank of a loopback ring of `world` forced to `channels`, each rank in
/// a thread, all joined within [`LIMIT`].
fn ring_of_channels<R: Send + 'static>(
    world: usize,
    channels: usize,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let (listeners, addresses) = common::listeners(world);
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (done, addresses, body) = (done.clone(), addresses.clone(), body.clone());
        thread::spawn(move || {
            let options = ConnectOptions::new().channels(channels);
            let timeout = Duration::from_secs(60);
            let ring = TcpCollective::connect_with_options(
                listener,
                rank,
                &addresses,
                "job-token",
                timeout,
                &options,
            );
            let ring = ring.unwrap_or_else(|e| panic!("rank {rank} connect: {e}"));
            let _ = done.send((rank, body(rank, ring)));
        });
    }
    drop(done);
    let deadline = Instant::now() + LIMIT;
    let mut out: Vec<(usize, R)> = (0..world)
        .map(|_| {
            let left = deadline.saturating_duration_since(Instant::now());
            results.recv_timeout(left).expect("every rank finishes in time (or one panicked)")
        })
        .collect();
    out.sort_unstable_by_key(|(rank, _)| *rank);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The names of this process's threads that drive channels.
fn channel_threads() -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    let names = tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok());
    names.map(|n| n.trim().to_string()).filter(|n| n.starts_with("silvic-")).collect()
}

#[test]
fn split_calls_give_the_bits_of_one_channel_and_the_threads_live_as_long_as_the_ring() {
    for world in [2, 3, 4] {
        let mut by_count = Vec::new();
        for channels in [1, 2, 3, 4] {
            let results = ring_of_channels(world, channels, move |rank, mut ring| {
                let mut sums: Vec<f64> = (0..LEN).map(|i| value(rank, i)).collect();
                ring.allreduce_sum_f64(&mut sums).unwrap();
                let mut maxes: Vec<f64> = (0..LEN).map(|i| value(rank, i)).collect();
                ring.allreduce_max_f64(&mut maxes).unwrap();
                let mut ints: Vec<i64> = (0..LEN).map(|i| i64::MAX - (i + rank) as i64).collect();
                ring.allreduce_sum_i64(&mut ints).unwrap();
                let mut small = vec![value(rank, 1); 1000];
                ring.allreduce_sum_f64(&mut small).unwrap();
                let named = channel_threads()
                    .iter()
                    .filter(|n| n.starts_with(&format!("silvic-{rank}-ch")))
                    .count();
                let per_channel = ring.channel_stats();
                let stats = ring.stats();
                let peers = ring.peer_stats();
                let bits: Vec<u64> = sums.iter().chain(&maxes).map(|x| x.to_bits()).collect();
                ((bits, ints, small[0].to_bits()), (named, per_channel, stats, peers))
            });
            for (rank, (_, (named, per_channel, stats, peers))) in results.iter().enumerate() {
                let case = format!("world {world} channels {channels} rank {rank}");
                assert_eq!(*named, channels - 1, "{case}: one named thread per further channel");
                assert_eq!(per_channel.len(), channels, "{case}");
                let sent: u64 = per_channel.iter().map(|c| c.bytes_sent).sum();
                assert_eq!(stats.bytes_sent, sent, "{case}: stats sum the channels");
                assert_eq!(stats.collectives, 4, "{case}");
                // Every channel carried its share of the split calls: at least a third of an
                // even share of one buffer each.
                let share = (LEN * 8 / channels / 3) as u64;
                assert!(
                    per_channel.iter().all(|c| c.bytes_sent > share),
                    "{case}: {per_channel:?}"
                );
                for c in 1..channels {
                    assert_eq!(peers.iter().filter(|p| p.channel == c).count(), 2, "{case}");
                }
            }
            by_count.push(results.into_iter().map(|(bits, _)| bits).collect::<Vec<_>>());
        }
        let one = &by_count[0];
        assert!(one.iter().all(|r| r == &one[0]), "world {world}: every rank has the same bits");
        for (c, results) in by_count.iter().enumerate() {
            assert!(results == one, "world {world}: {} channels changed a bit", c + 1);
        }
    }
    assert_eq!(channel_threads(), Vec::<String>::new(), "every channel thread joined on drop");
}

#[test]
fn a_rank_that_dies_mid_call_fails_every_channel_of_the_others_naming_it() {
    let (world, channels) = (3, 4);
    let results = ring_of_channels(world, channels, move |rank, mut ring| {
        let mut buf: Vec<f64> = (0..4 * LEN).map(|i| value(rank, i)).collect();
        if rank == 2 {
            // Dies as a killed process does: its streams close mid-call.
            ring.allreduce_sum_f64(&mut buf[..10]).ok();
            drop(ring);
            return None;
        }
        let first = ring.allreduce_sum_f64(&mut buf[..10]).and_then(|()| {
            let started = Instant::now();
            let failed = ring.allreduce_sum_f64(&mut buf);
            failed.map(|()| started.elapsed())
        });
        let again = ring.allreduce_sum_f64(&mut buf);
        Some((first, again))
    });
    for (rank, result) in results.into_iter().enumerate().take(2) {
        let (first, again) = result.unwrap();
        let error = first.expect_err("the call of a ring whose rank 2 died fails");
        let names_it = match &error {
            CollectiveError::PeerClosed { peer } => *peer == 2,
            CollectiveError::Aborted { origin, .. } => *origin == 2,
            CollectiveError::Io { peer, .. } => *peer == 2,
            _ => false,
        };
        assert!(names_it, "rank {rank}: {error}");
        assert_eq!(again, Err(error), "rank {rank}: the error sticks");
    }
}
