//! Rings of threads on loopback split over channels (`ConnectOptions::channels`): a split call
//! gives the bits of one channel; each further channel is a named thread that exists while the
//! ring does and is gone once it is dropped; `stats()` sums the channels and `channel_stats()`
//! says each; a rank that dies mid-call ends the call on every channel of every other rank,
//! each naming it, and the error sticks.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use silvic_core::fold;
use silvic_net::{
    AllreducePath, Collective, CollectiveError, ConnectOptions, Numbers, Reduction, TcpCollective,
    TrainerCollective,
};

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
    ring_on(world, ConnectOptions::new().channels(channels), body)
}

/// Runs `body` on every rank of a loopback ring of `world` connected with `options`, each rank
/// in a thread, all joined within [`LIMIT`].
fn ring_on<R: Send + 'static>(
    world: usize,
    options: ConnectOptions,
    body: impl Fn(usize, TcpCollective) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let (listeners, addresses) = common::listeners(world);
    let (done, results) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (done, addresses, body) = (done.clone(), addresses.clone(), body.clone());
        let options = options.clone();
        thread::spawn(move || {
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
        // Heard directly (rank 2 closed), or relayed by the rank that heard it first (which
        // names rank 2 as the one that failed): either way the error names rank 2.
        assert_eq!(error.peer(), Some(2), "rank {rank}: {error}");
        assert!(!matches!(error, CollectiveError::Timeout { .. }), "rank {rank}: {error}");
        assert_eq!(again, Err(error), "rank {rank}: the error sticks");
    }
}

/// The element types of the trainers' allreduce, each rank's values for element `i` made from
/// one `f64` whose sums depend on the order (and integers that wrap).
trait Typed: Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    fn of(rank: usize, i: usize) -> Self;
    fn numbers(buf: &mut [Self]) -> Numbers<'_>;
    fn fold(reduction: Reduction) -> fn(Self, Self) -> Self;
    /// The bits of the value (a float's by `to_bits`, so NaN and -0.0 are told apart).
    fn bits(self) -> u128;
}

macro_rules! typed {
    ($t:ty, $variant:ident, $of:expr, $sum:path, $min:path, $max:path) => {
        typed!($t, $variant, $of, $sum, $min, $max, |x: $t| x as u128);
    };
    ($t:ty, $variant:ident, $of:expr, $sum:path, $min:path, $max:path, $bits:expr) => {
        impl Typed for $t {
            fn of(rank: usize, i: usize) -> Self {
                $of(rank, i)
            }
            fn numbers(buf: &mut [Self]) -> Numbers<'_> {
                Numbers::$variant(buf)
            }
            fn fold(reduction: Reduction) -> fn(Self, Self) -> Self {
                match reduction {
                    Reduction::Sum => $sum,
                    Reduction::Min => $min,
                    _ => $max,
                }
            }
            fn bits(self) -> u128 {
                $bits(self)
            }
        }
    };
}

typed!(
    f32,
    F32,
    |r, i| value(r, i) as f32,
    fold::sum_f32,
    fold::min_f32,
    fold::max_f32,
    |x: f32| { u128::from(x.to_bits()) }
);
typed!(f64, F64, value, fold::sum_f64, fold::min_f64, fold::max_f64, |x: f64| u128::from(
    x.to_bits()
));
typed!(i32, I32, |r, i| i32::MAX - (i * 3 + r) as i32, fold::sum_i32, fold::min_int, fold::max_int);
typed!(i64, I64, |r, i| i64::MAX - (i * 3 + r) as i64, fold::sum_i64, fold::min_int, fold::max_int);
typed!(u64, U64, |r, i| u64::MAX - (i + r) as u64, fold::sum_u64, fold::min_int, fold::max_int);
typed!(
    i128,
    I128,
    |r, i| i128::MAX - (i * 5 + r) as i128 * (1 << 70),
    fold::sum_i128,
    fold::min_int,
    fold::max_int
);

/// The segment of element `i` (the first `len % world` segments one longer).
fn segment_of(i: usize, len: usize, world: usize) -> usize {
    let (base, extra) = (len / world, len % world);
    let long = extra * (base + 1);
    if i < long { i / (base + 1) } else { extra + (i - long) / base }
}

/// Element `i` of every rank's values folded over ranks `j, j + 1, …` of its segment `j`: the
/// documented fold order, which every path and every channel count keeps.
fn oracle<T: Typed>(world: usize, len: usize, f: fn(T, T) -> T) -> Vec<T> {
    (0..len)
        .map(|i| {
            let j = segment_of(i, len, world);
            (1..world).fold(T::of(j, i), |acc, k| f(acc, T::of((j + k) % world, i)))
        })
        .collect()
}

/// A length of `T` past two of a channel's least shares (2 MiB), so a forced count splits it,
/// and divisible by none of 2, 3, 5 and 7; and lengths shorter than the counts.
fn lengths<T>(path: AllreducePath) -> Vec<usize> {
    let split = (2usize << 20) / size_of::<T>() + 1;
    let split = (split..).find(|n| [2, 3, 5, 7].iter().all(|d| n % d != 0)).unwrap();
    match path {
        // Only the ring plan runs split: the other paths, forced, carry a call on one channel
        // (or leave a call they do not carry to the choice, the ring's at these sizes).
        AllreducePath::Auto | AllreducePath::Ring => vec![3, 1001, split],
        _ => vec![3, 1001],
    }
}

/// Every reduction of `T` at the [`lengths`] of `path` on `ring`, each result compared with its
/// oracle in `expected` (by reduction, then the lengths of the ring path): the cases whose bits
/// differ.
fn check_type<T: Typed>(
    ring: &mut TcpCollective,
    (rank, path): (usize, AllreducePath),
    expected: &[Vec<T>],
) -> Vec<String> {
    let mut wrong = Vec::new();
    let (all, taken) = (lengths::<T>(AllreducePath::Ring), lengths::<T>(path));
    let cases = Reduction::ALL.iter().flat_map(|&r| all.iter().map(move |&len| (r, len)));
    for ((reduction, len), expected) in cases.zip(expected) {
        if !taken.contains(&len) {
            continue;
        }
        let mut buf: Vec<T> = (0..len).map(|i| T::of(rank, i)).collect();
        ring.allreduce(T::numbers(&mut buf), reduction).unwrap();
        let same = buf.iter().zip(expected).all(|(a, b)| a.bits() == b.bits());
        if !same {
            wrong.push(format!("{} {reduction:?} len {len}", std::any::type_name::<T>()));
        }
    }
    wrong
}

/// Every oracle of `T` in a world of `world`, by reduction then length (as [`check_type`]).
fn oracles<T: Typed>(world: usize) -> Vec<Vec<T>> {
    let lengths = lengths::<T>(AllreducePath::Ring);
    let cases = Reduction::ALL.iter().flat_map(|&r| lengths.iter().map(move |&len| (r, len)));
    cases.map(|(reduction, len)| oracle(world, len, T::fold(reduction))).collect()
}

/// The bitwise oracle over sockets: for every forced path and every channel count (1, 2, 3, 4
/// and 8), every reduction of every element type, `i128` included, at a length the counts
/// split (divisible by none of them), one shorter than them and one in between, gives every
/// rank the fold-order oracle's bits. (`ring/channel_tests.rs` checks worlds 1 to 9 in memory,
/// at lengths of every kind.)
fn every_path_and_channel_count_gives_the_oracle_bits_for_every_op(worlds: &[usize]) {
    for &world in worlds {
        let expected = std::sync::Arc::new((
            oracles::<f32>(world),
            oracles::<f64>(world),
            oracles::<i32>(world),
            oracles::<i64>(world),
            oracles::<u64>(world),
            oracles::<i128>(world),
        ));
        for path in AllreducePath::ALL {
            for channels in [1, 2, 3, 4, 8] {
                let options = ConnectOptions::new().allreduce(path).channels(channels);
                let expected = expected.clone();
                let results = ring_on(world, options, move |rank, mut ring| {
                    let (a, b, c, d, e, f) = &*expected;
                    let on = (rank, path);
                    let mut wrong = check_type(&mut ring, on, a);
                    wrong.extend(check_type(&mut ring, on, b));
                    wrong.extend(check_type(&mut ring, on, c));
                    wrong.extend(check_type(&mut ring, on, d));
                    wrong.extend(check_type(&mut ring, on, e));
                    wrong.extend(check_type(&mut ring, on, f));
                    wrong
                });
                for (rank, wrong) in results.into_iter().enumerate() {
                    let case = format!("world {world} path {path:?} channels {channels}");
                    assert!(wrong.is_empty(), "{case} rank {rank}: bits differ: {wrong:?}");
                }
            }
        }
    }
}

#[test]
fn every_path_and_channel_count_gives_the_oracle_bits_for_every_op_worlds_1_to_3() {
    every_path_and_channel_count_gives_the_oracle_bits_for_every_op(&[1, 2, 3]);
}

#[test]
fn every_path_and_channel_count_gives_the_oracle_bits_for_every_op_world_5() {
    every_path_and_channel_count_gives_the_oracle_bits_for_every_op(&[5]);
}
