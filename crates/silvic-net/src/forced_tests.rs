//! What `connect` does with a forced allreduce path or channel count ([`ConnectOptions`], the
//! variables `from_vars` reads), over real rings (threads on loopback): every rank must take the
//! same settings, a forced path is the one the calls take (seen in the bytes each stream
//! carried), a path that cannot carry a call leaves it to the automatic choice, and ranks whose
//! calls take different paths fail at the first frame naming each other. The settings' own
//! parsing and agreement, without sockets, are tested in `options.rs`.
//!
//! Every test is bounded: the ranks are joined within [`LIMIT`], and each connect within its own
//! rendezvous timeout (a hang fails the test).

use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use silvic_core::{Collective, CollectiveError, Op, fold};

use super::*;
use crate::options::{ALLREDUCE_VARIABLE, AllreducePath};

const LIMIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "an-options-test-token-0123456789";

/// Connects a ring of `paths.len()` ranks as threads on 127.0.0.1, rank `r` forcing
/// `paths[r]` through [`ConnectOptions`], and runs `body` on each connected rank; every rank's
/// outcome in rank order, within [`LIMIT`].
fn ring<R: Send + 'static>(
    paths: &[AllreducePath],
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<Result<R, ConnectError>> {
    ring_with(paths.iter().map(|&path| ConnectOptions::new().allreduce(path)).collect(), body)
}

/// [`ring`], rank `r` connecting with `options[r]`.
fn ring_with<R: Send + 'static>(
    options: Vec<ConnectOptions>,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + 'static,
) -> Vec<Result<R, ConnectError>> {
    let body = Arc::new(body);
    let world = options.len();
    let listeners: Vec<_> = (0..world).map(|_| TcpCollective::bind("127.0.0.1").unwrap()).collect();
    let addresses: Vec<String> = listeners.iter().map(|l| l.address()).collect();
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (done, addresses, body) = (done.clone(), addresses.clone(), body.clone());
        let options = options[rank].clone();
        thread::spawn(move || {
            let timeout = Duration::from_secs(20);
            let connected = TcpCollective::connect_with_options(
                listener, rank, &addresses, TOKEN, timeout, &options,
            );
            let _ = done.send((rank, connected.map(|ring| body(rank, ring))));
        });
    }
    drop(done); // a rank that panics ends the wait at once
    let until = Instant::now() + LIMIT;
    let mut out: Vec<Option<Result<R, ConnectError>>> = (0..world).map(|_| None).collect();
    for _ in 0..world {
        let left = until.saturating_duration_since(Instant::now());
        let (rank, outcome) = results.recv_timeout(left).expect("a rank hung or panicked");
        out[rank] = Some(outcome);
    }
    out.into_iter().map(|o| o.expect("every rank answered")).collect()
}

#[test]
fn a_rank_forced_onto_another_path_fails_every_ranks_connect_naming_it() {
    use AllreducePath::{Auto, Index};
    let outcomes = ring(&[Auto, Auto, Index, Auto], |_, _| ());
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(error @ ConnectError::Disagreement { .. }) => {
                let ConnectError::Disagreement { setting, ranks, .. } = &error else {
                    unreachable!()
                };
                assert_eq!((setting.as_str(), ranks.as_slice()), ("SILVIC_ALLREDUCE", &[2][..]));
                assert_eq!((error.peer(), error.kind()), (Some(2), "disagreement"));
                assert!(error.to_string().contains("index on rank 2"), "rank {rank}: {error}");
            }
            Err(other) => panic!("rank {rank}: {other}"),
            Ok(()) => panic!("rank {rank} connected though rank 2 forces another path"),
        }
    }
}

#[test]
fn a_rank_forced_onto_another_channel_count_fails_every_ranks_connect_naming_it() {
    let counts = [2, 2, 4, 2];
    let options = counts.iter().map(|&n| ConnectOptions::new().channels(n)).collect();
    let outcomes = ring_with(options, |_, _| ());
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(error @ ConnectError::Disagreement { .. }) => {
                let ConnectError::Disagreement { setting, ranks, .. } = &error else {
                    unreachable!()
                };
                assert_eq!((setting.as_str(), ranks.as_slice()), ("SILVIC_CHANNELS", &[2][..]));
                assert_eq!(error.peer(), Some(2), "rank {rank}: {error}");
                assert!(error.to_string().contains("4 on rank 2"), "rank {rank}: {error}");
            }
            Err(other) => panic!("rank {rank}: {other}"),
            Ok(()) => panic!("rank {rank} connected though rank 2 forces another channel count"),
        }
    }
}

/// What one rank saw of one allreduce of `len` f64: the result's bits, the bytes it sent, and
/// the bytes it sent over chord streams.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    bits: Vec<u64>,
    sent: u64,
    over_chords: u64,
}

/// Every rank of a world of `world`, all forcing `path`, sums `len` f64 once.
fn sum_on(path: AllreducePath, world: usize, len: usize) -> Vec<Seen> {
    let body = move |rank: usize, mut ring: TcpCollective| {
        let mut buf: Vec<f64> = (0..len).map(|i| ((rank * 7 + i) % 1000) as f64).collect();
        ring.allreduce_sum_f64(&mut buf).expect("the sum");
        let over_chords =
            ring.peer_stats().iter().filter(|p| p.offset.abs() > 1).map(|p| p.bytes_sent).sum();
        Seen {
            bits: buf.iter().map(|x| x.to_bits()).collect(),
            sent: ring.stats().bytes_sent,
            over_chords,
        }
    };
    ring(&vec![path; world], body)
        .into_iter()
        .enumerate()
        .map(|(rank, seen)| seen.unwrap_or_else(|e| panic!("{path} rank {rank}: {e}")))
        .collect()
}

fn expected_bits(world: usize, len: usize) -> Vec<u64> {
    let sum = |i: usize| (0..world).map(|r| ((r * 7 + i) % 1000) as f64).sum::<f64>();
    (0..len).map(|i| sum(i).to_bits()).collect()
}

#[test]
fn every_forced_path_is_the_one_taken_at_world_8_and_gives_the_same_bits() {
    use AllreducePath::{Bruck, Gather, Index, Ring};
    let (world, len) = (8, 2048);
    let bytes = (len * 8) as u64;
    let expected = expected_bits(world, len);
    for path in [Ring, Gather, Bruck, Index] {
        for (rank, seen) in sum_on(path, world, len).into_iter().enumerate() {
            assert_eq!(seen.bits, expected, "{path} rank {rank}");
            let (sent, chords) = (seen.sent, seen.over_chords);
            // Payload bytes per rank: the ring 2(n-1)/n S, both gathers (n-1) S, the index
            // (P(n) + n - 1) S / n with P(8) = 12; a waiting notice or header is far less than S.
            let (low, high, over_chords) = match path {
                Ring => (bytes * 7 / 4, bytes * 2, false),
                Gather => (bytes * 7, bytes * 15 / 2, false),
                Bruck => (bytes * 7, bytes * 15 / 2, true),
                _ => (bytes * 19 / 8, bytes * 3, true),
            };
            assert!((low..high).contains(&sent), "{path} rank {rank} sent {sent} of {bytes}");
            assert_eq!(chords >= bytes / 2, over_chords, "{path} rank {rank}: {chords} on chords");
        }
    }
}

#[test]
fn a_forced_path_that_cannot_carry_a_call_leaves_it_to_the_automatic_choice() {
    use AllreducePath::{Auto, Bruck, Gather, Index, Ring};
    // World 4 forms no chord streams: Bruck and the index send what the automatic path (the
    // gather, at 512 B) sends, give or take a few waiting notices (44 bytes each).
    let (world, len) = (4, 64);
    let close = |a: u64, b: u64| a.abs_diff(b) < 300;
    let auto: Vec<u64> = sum_on(Auto, world, len).iter().map(|s| s.sent).collect();
    let ring: Vec<u64> = sum_on(Ring, world, len).iter().map(|s| s.sent).collect();
    assert!(!close(auto[0], ring[0]), "the bytes tell the paths apart: {auto:?} {ring:?}");
    for path in [Bruck, Index] {
        let seen = sum_on(path, world, len);
        for (rank, seen) in seen.iter().enumerate() {
            assert_eq!(seen.bits, expected_bits(world, len), "{path} rank {rank}");
            let (sent, want) = (seen.sent, auto[rank]);
            assert!(close(sent, want), "{path} rank {rank}: {sent} against {want}");
        }
    }
    // 2 MiB at world 4 is past the gather's memory bound (4 MiB in all): the ring carries it.
    let len = 1 << 18;
    let bytes = (len * 8) as u64;
    for (rank, seen) in sum_on(Gather, world, len).iter().enumerate() {
        assert_eq!(seen.bits, expected_bits(world, len), "rank {rank}");
        assert!(seen.sent < bytes * 2, "rank {rank} sent {} of {bytes}: not the ring", seen.sent);
    }
}

#[test]
fn from_vars_reads_the_variable_and_a_bad_value_names_it_before_any_socket() {
    for value in ["rings", "RING", "auto ring"] {
        let vars = |name: &str| (name == ALLREDUCE_VARIABLE).then(|| value.to_string());
        match TcpCollective::from_vars(vars, Duration::from_secs(5)) {
            Err(ConnectError::Environment { variable, message }) => {
                assert_eq!(variable, "SILVIC_ALLREDUCE");
                assert!(
                    message.contains(&format!("{value:?} is not an allreduce path")),
                    "{message}"
                );
            }
            other => panic!("{value:?}: {other:?}"),
        }
    }
}

#[test]
fn ranks_launched_with_another_variable_fail_alike_naming_the_rank() {
    // Two ranks meeting in a folder, rank 1 with SILVIC_ALLREDUCE=gather.
    // The ranks make the folder themselves (0700); each withdraws its file when connect fails.
    let dir = std::env::temp_dir().join(format!("silvic-options-{}", std::process::id()));
    let url = format!("file://{}", dir.display());
    let (done, results) = mpsc::channel();
    for rank in 0..2 {
        let (done, url) = (done.clone(), url.clone());
        thread::spawn(move || {
            let vars = |name: &str| match name {
                "SILVIC_RANK" => Some(rank.to_string()),
                "SILVIC_WORLD_SIZE" => Some("2".into()),
                "SILVIC_RENDEZVOUS" => Some(url.clone()),
                "SILVIC_JOB_TOKEN" => Some(TOKEN.into()),
                "SILVIC_SOCKET_IFNAME" => Some("lo".into()),
                "SILVIC_ALLREDUCE" if rank == 1 => Some("gather".into()),
                _ => None,
            };
            let _ = done.send((rank, TcpCollective::from_vars(vars, Duration::from_secs(20))));
        });
    }
    drop(done);
    let until = Instant::now() + LIMIT;
    for _ in 0..2 {
        let left = until.saturating_duration_since(Instant::now());
        let (rank, outcome) = results.recv_timeout(left).expect("a rank hung or panicked");
        match outcome {
            Err(ConnectError::Disagreement { ranks, detail, .. }) => {
                assert_eq!(ranks, [1], "rank {rank}: {detail}");
                assert!(detail.contains("gather on rank 1, against auto on rank 0"), "{detail}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every rank of `paths.len()` connects with the automatic path, then runs one sum of 64 f64
/// on `paths[rank]` (as if each had been forced alone, past the agreement); every rank's error.
/// The ranks hold their rings until all are done: a rank that closes its ring early would fail
/// its neighbours' calls with its close instead of the frames under test.
fn one_sum_on(paths: &'static [crate::ring::choice::Path]) -> Vec<CollectiveError> {
    let world = paths.len();
    let done = Arc::new(Barrier::new(world));
    let outcomes = ring(&vec![AllreducePath::Auto; world], move |rank, mut ring| {
        let mut buf = vec![rank as f64; 64];
        let op = Op::AllreduceSumF64;
        let result = ring.run(op, 512, |link, seq, scratch| {
            let call = crate::ring::Call { rank, world, op, seq };
            crate::ring::allreduce_on(paths[rank], link, call, &mut buf, fold::sum_f64, scratch)
        });
        done.wait();
        result
    });
    let errors = outcomes.into_iter().enumerate().map(|(rank, outcome)| {
        match outcome.unwrap_or_else(|e| panic!("rank {rank} connect: {e}")) {
            Ok(()) => panic!("rank {rank} finished a call the others took on another path"),
            Err(error) => error,
        }
    });
    errors.collect()
}

/// Whether `error` is a malformed frame of another path, naming a rank of `peers`.
fn refused_naming(error: &CollectiveError, peers: &[usize]) -> bool {
    matches!(error, CollectiveError::MalformedFrame { peer, reason }
        if peers.contains(peer) && reason.contains("the ranks disagree on the allreduce path"))
}

#[test]
fn two_ranks_on_different_paths_fail_at_the_first_frame_naming_each_other() {
    use crate::ring::choice::Path::{Bruck, Gather, Index, Ring};
    // World 2 carries every path over its two ring streams; any two differ at the first frame
    // (a timeout would mean a rank waited for frames that never came).
    for pair in [[Ring, Index], [Gather, Ring], [Bruck, Gather], [Index, Bruck]] {
        let paths: &'static [crate::ring::choice::Path] = Box::leak(Box::new(pair));
        let errors = one_sum_on(paths);
        assert!(refused_naming(&errors[0], &[1]), "{pair:?} rank 0: {}", errors[0]);
        assert!(refused_naming(&errors[1], &[0]), "{pair:?} rank 1: {}", errors[1]);
    }
}

#[test]
fn a_rank_on_another_path_among_eight_fails_every_rank_naming_it() {
    use crate::ring::choice::Path::{Bruck, Ring};
    // Rank 3 takes Bruck's rounds (over chords, formed at eight ranks) while the rest take the
    // ring. The ranks that get a frame of rank 3's refuse it, naming it; the others hear the
    // refusal relayed; rank 3 refuses a ring frame, or hears its own frame was refused.
    let errors = one_sum_on(&[Ring, Ring, Ring, Bruck, Ring, Ring, Ring, Ring]);
    for (rank, error) in errors.iter().enumerate() {
        let others: Vec<usize> = (0..8).filter(|&r| r != rank).collect();
        let names_three = match error {
            CollectiveError::Aborted { origin, cause } => {
                refused_naming(cause, &others) && (*origin == 3 || cause.peer() == Some(3))
            }
            direct => refused_naming(direct, if rank == 3 { &others } else { &[3] }),
        };
        assert!(names_three, "rank {rank}: {error}");
    }
}
