//! What a ring measures of its network when it forms: the cost of a hop, which sets the ring
//! plan's window ([`schedule::window`]) and the cut between paths; where hops are long, the
//! rate a rank's bytes leave it, which the cut weighs against the hops (`ring::chosen_path`);
//! and the allreduce path every rank was told to force (`options.rs`).
//!
//! Every rank times a few one-element allreduces (the gather path: `floor(n/2)` hops each, every
//! rank in step with its neighbours), takes its fastest, and the ranks agree with one more
//! allreduce (a max) of `1 + world` numbers: the slowest rank's figure, and each rank's path in
//! its own place (every other rank gives 0 there). So every rank derives the same window from the
//! same number, whatever its own clock saw, and every rank knows every rank's path: if they
//! differ, every rank's `connect` fails with the same error, naming the ranks that differ.
//!
//! Where the agreed hop is at least [`Network::LOG_DEPTH_FROM_HOP_NS`] (every rank knows it, so
//! every rank decides alike; loopback's hops are shorter, on a machine not starved of cores, and
//! skip this), every rank then times ring-path allreduces of up to [`RATE_PROBE_BYTES`]
//! ([`rate_probe_bytes`]: each segment one slice, so the ring plan's time is the cost model's),
//! takes its fastest, and the ranks agree on the slowest rank's time with one more allreduce
//! (a max), and in the same one on the slowest rank's fold: each rank times the gather path's
//! own fold of a few small buffers ([`fold_probe_ns`], memory it holds anyway), so every rank
//! derives the same fold rate ([`fold_rate_from`]). Where the first round's time's bytes took
//! less than its hops (a fast link, long hops), a second round does the same with a buffer
//! large enough for its bytes to take about as long as its hops ([`longer_probe_bytes`]).
//! Every rank derives the same rate from the last agreed time ([`rate_from`]): the bytes one
//! rank sends over what is left of the time once the ring's hops at the agreed hop, and its
//! folds at the agreed fold rate, are taken off. The two rates stay apart because the paths
//! fold very different shares of what they send: Bruck's gather folds all it sends, the index
//! a seventh of it at world 8, and a network's bytes cost far more than a core's folds.
//!
//! Invariants:
//! - The probes are calls of the ring's own plans, numbered from [`FIRST_PROBE_SEQ`] up to
//!   `u64::MAX`, a range no collective of the caller reaches: the caller's calls still count
//!   from 0, and a probe frame can never be taken for one of theirs.
//! - A failure while probing is a failure of `connect`, naming the rank, and the ring is not
//!   handed out; except an abort from another rank (it failed, in a probe or already in its
//!   first call, since ranks leave the probes one after another), which `connect` hands out as
//!   a failed ring whose every call returns it.
//! - The result is a function of the agreed numbers alone ([`hop_from`],
//!   [`longer_probe_bytes`] and [`rate_from`] are pure), and so is every choice of what to
//!   probe next: every rank runs the same calls.

use std::time::{Duration, Instant};

use silvic_core::{CollectiveError, Dtype, Op, Reduction, fold};
use std::hint::black_box;

use tracing::{info, warn};

use crate::error::{ConnectError, as_seen_by};
use crate::link::TcpRing;
use crate::options::{self, AllreducePath};
use crate::ring::choice::{self, Forced, Path};
use crate::ring::seam::{Network, Route};
use crate::ring::{self, Call, Link, Scratch, allreduce, bruck, schedule, twoway};

/// Timed probes of the hop. The first also waits for the slowest rank to arrive, so the fastest
/// of the rest is the figure.
pub(crate) const HOP_PROBES: u64 = 6;

/// The first round of rate probes, where hops are long, each of [`rate_probe_bytes`]; the
/// first is left out likewise.
pub(crate) const RATE_PROBES: u64 = 3;

/// The second round of rate probes, of [`longer_probe_bytes`] each, where the first round's
/// bytes took less time than its hops; all timed (the ranks are in step by then).
pub(crate) const LONGER_RATE_PROBES: u64 = 2;

/// Every call `connect` may run once the ring forms: the hop's probes and their agreement,
/// then each round of rate probes and its agreement.
pub(crate) const PROBE_CALLS: u64 = HOP_PROBES + 1 + RATE_PROBES + 1 + LONGER_RATE_PROBES + 1;

/// The sequence number of the first probe; the rest follow it, the last at `u64::MAX`.
pub(crate) const FIRST_PROBE_SEQ: u64 = u64::MAX - (PROBE_CALLS - 1);

/// The sequence number of the hop's agreement, after its probes.
const HOP_AGREEMENT_SEQ: u64 = FIRST_PROBE_SEQ + HOP_PROBES;

/// The sequence number of the first rate probe; the round's agreement follows its last.
const FIRST_RATE_SEQ: u64 = HOP_AGREEMENT_SEQ + 1;

/// The sequence number of the first probe of the second round of rate probes.
const LONGER_RATE_SEQ: u64 = FIRST_RATE_SEQ + RATE_PROBES + 1;

/// The op every probe and agreement runs as.
const PROBE_OP: Op = Op::Allreduce { reduction: Reduction::Max, dtype: Dtype::U64 };

/// The most bytes of each probe of the first round of rate probes ([`rate_probe_bytes`]): on
/// a link below 1.5 GB/s, more time on bytes than on the hops of a ring of 16 at 100 us.
pub(crate) const RATE_PROBE_BYTES: usize = 1 << 20;

/// The most bytes of a probe of the second round ([`longer_probe_bytes`]): the time and the
/// memory `connect` spends on it.
pub(crate) const LONGER_PROBE_MAX_BYTES: usize = 16 << 20;

/// The highest rate [`rate_from`] and [`fold_rate_from`] give, in bytes per microsecond (about
/// 1 TB/s): what a probe whose time its hops alone account for comes to. It keeps the cost
/// model's integers far from overflowing.
pub(crate) const MAX_BYTES_PER_US: u64 = 1 << 20;

/// The buffers of the fold probe ([`fold_probe_ns`]): the gather path's fold of this many
/// ranks' blocks of [`FOLD_PROBE_BLOCK_BYTES`], so `(FOLD_PROBE_RANKS - 1)` blocks folded.
const FOLD_PROBE_RANKS: usize = 4;

/// The block of each rank the fold probe folds, as large as the histograms trainers fold: the
/// probe holds 160 KiB a rank, less than the rate probe's buffer that follows it.
const FOLD_PROBE_BLOCK_BYTES: usize = 32 << 10;

/// Folds in one timed run of the fold probe; the fastest of [`FOLD_PROBE_RUNS`] runs counts.
const FOLD_PROBE_FOLDS: u64 = 16;
const FOLD_PROBE_RUNS: usize = 3;

/// The bytes one fold of the fold probe folds.
pub(crate) const FOLD_PROBE_FOLDED: u64 = ((FOLD_PROBE_RANKS - 1) * FOLD_PROBE_BLOCK_BYTES) as u64;

/// What every rank agreed on when the ring formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Agreed {
    /// The network (without its chords: the link knows those).
    pub(crate) network: Network,
    /// Every rank's allreduce path, by rank.
    pub(crate) paths: Vec<AllreducePath>,
}

/// Measures the ring's hop over `link`, and its rate where the hop is long, and agrees on them,
/// and on every rank's `path`, with every rank (see the module doc).
pub(crate) fn measure(
    link: &mut dyn Link,
    rank: usize,
    world: usize,
    path: AllreducePath,
    scratch: &mut Scratch,
) -> Result<Agreed, CollectiveError> {
    measure_from(link, rank, world, path, scratch, Network::LOG_DEPTH_FROM_HOP_NS)
}

/// [`measure`], timing the rate where the agreed hop is at least `rate_from_hop_ns` (the tests
/// time it wherever they like).
fn measure_from(
    link: &mut dyn Link,
    rank: usize,
    world: usize,
    path: AllreducePath,
    scratch: &mut Scratch,
    rate_from_hop_ns: u64,
) -> Result<Agreed, CollectiveError> {
    let call = |seq| Call { rank, world, op: PROBE_OP, seq };
    let mut fastest = Duration::MAX;
    for i in 0..HOP_PROBES {
        let mut one = [0u64];
        let started = Instant::now();
        allreduce(link, call(FIRST_PROBE_SEQ + i), &mut one, fold::max_int, scratch)?;
        if i > 0 {
            fastest = fastest.min(started.elapsed());
        }
    }
    let mut agreed = vec![0; 1 + world];
    agreed[0] = hop_from(fastest, world);
    agreed[1 + rank] = path.code();
    allreduce(link, call(HOP_AGREEMENT_SEQ), &mut agreed, fold::max_int, scratch)?;
    let path_of = |(r, &code): (usize, &u64)| {
        AllreducePath::from_code(code).ok_or_else(|| CollectiveError::MalformedFrame {
            peer: r,
            reason: format!("the agreement gives rank {r} path number {code}, which names none"),
        })
    };
    let paths = agreed[1..].iter().enumerate().map(path_of).collect::<Result<_, _>>()?;
    let hop_ns = agreed[0];
    let mut network = Network { hop_ns, ..Network::UNMEASURED };
    if world > 1 && hop_ns >= rate_from_hop_ns {
        let mut round = |first_seq, probes, left_out, bytes, also| {
            let calls = (first_seq..first_seq + probes).map(call);
            timed_ring(link, calls, left_out, bytes, (call(first_seq + probes), also), scratch)
        };
        let mut bytes = rate_probe_bytes(world);
        let (mut time, fold_ns) = round(FIRST_RATE_SEQ, RATE_PROBES, 1, bytes, fold_probe_ns())?;
        network.folds_per_us = fold_rate_from(fold_ns);
        // Every rank has the same time, so every rank runs the second round or none does.
        if let Some(longer) = longer_probe_bytes(time, world, hop_ns) {
            bytes = longer;
            (time, _) = round(LONGER_RATE_SEQ, LONGER_RATE_PROBES, 0, bytes, 0)?;
        }
        network.bytes_per_us = rate_from(time, bytes, world, hop_ns, network.folds_per_us);
    }
    Ok(Agreed { network, paths })
}

/// Times a ring-path allreduce of `bytes` as each of `probes`, the first `left_out` not
/// counted, and agrees on the slowest rank's fastest time in the call `agreement`, and in the
/// same call on the largest of every rank's `also`: returns both.
fn timed_ring(
    link: &mut dyn Link,
    probes: impl Iterator<Item = Call>,
    left_out: usize,
    bytes: usize,
    (agreement, also): (Call, u64),
    scratch: &mut Scratch,
) -> Result<(Duration, u64), CollectiveError> {
    let ring = Path::Ring;
    let mut buf = vec![agreement.rank as u64; bytes / 8];
    let mut fastest = Duration::MAX;
    for (i, probe) in probes.enumerate() {
        let started = Instant::now();
        ring::allreduce_on(ring, link, probe, &mut buf, fold::max_int, scratch)?;
        if i >= left_out {
            fastest = fastest.min(started.elapsed());
        }
    }
    let mut slowest = [u64::try_from(fastest.as_nanos()).unwrap_or(u64::MAX), also];
    allreduce(link, agreement, &mut slowest, fold::max_int, scratch)?;
    Ok((Duration::from_nanos(slowest[0]), slowest[1]))
}

/// How long this rank takes to fold [`FOLD_PROBE_FOLDED`] bytes, in nanoseconds: the gather
/// path's fold ([`ring::fold_gathered`], f64 sums) of [`FOLD_PROBE_RANKS`] blocks, the fastest
/// of a few runs (a rank that shares its core may lose one to another), at least 1.
pub(crate) fn fold_probe_ns() -> u64 {
    let gathered = vec![0u8; FOLD_PROBE_RANKS * FOLD_PROBE_BLOCK_BYTES];
    let mut out = vec![0f64; FOLD_PROBE_BLOCK_BYTES / 8];
    let block = FOLD_PROBE_BLOCK_BYTES;
    let mut fastest = Duration::MAX;
    for _ in 0..FOLD_PROBE_RUNS {
        let started = Instant::now();
        for _ in 0..FOLD_PROBE_FOLDS {
            ring::fold_gathered(
                &mut out,
                FOLD_PROBE_RANKS,
                black_box(&gathered),
                block,
                fold::sum_f64,
            );
            black_box(&mut out);
        }
        fastest = fastest.min(started.elapsed());
    }
    let per_fold = fastest.as_nanos() / u128::from(FOLD_PROBE_FOLDS);
    u64::try_from(per_fold).unwrap_or(u64::MAX).max(1)
}

/// The rate a rank folds, in bytes per microsecond, from `fold_ns`, the agreed time of one fold
/// of the fold probe ([`fold_probe_ns`]). From 1 to [`MAX_BYTES_PER_US`].
pub(crate) fn fold_rate_from(fold_ns: u64) -> u64 {
    let rate = u128::from(FOLD_PROBE_FOLDED) * 1000 / u128::from(fold_ns.max(1));
    u64::try_from(rate).unwrap_or(MAX_BYTES_PER_US).clamp(1, MAX_BYTES_PER_US)
}

/// Measures the network of a ring `connect` has just formed, agrees on the allreduce path
/// (this rank's is `path`), and hands both to the ring. `Ok(None)` once measured;
/// `Ok(Some(error))` when another rank failed first (an abort came, see the module doc), for
/// the ring to be handed out failed; `Err` naming the rank at fault otherwise, or
/// [`ConnectError::Disagreement`] on every rank where the paths differ. On a failure of a
/// probe the neighbours are told and the streams shut.
pub(crate) fn settle(
    ring: &mut TcpRing,
    rank: usize,
    path: AllreducePath,
    scratch: &mut Scratch,
    addresses: &[String],
    timeout: Duration,
) -> Result<Option<CollectiveError>, ConnectError> {
    let world = addresses.len();
    match measure(ring, rank, world, path, scratch) {
        Ok(Agreed { network, paths }) => {
            // Every rank has the same list, so every rank fails alike: nobody waits on another.
            let path = options::agreed(&paths)?;
            // Every rank formed the same topology, so every rank finds the same routes.
            let chords = world > 1
                && (0..bruck::rounds(world)).map(bruck::route).all(|route| {
                    ring.carries(route) && ring.carries(Route { offset: -route.offset })
                });
            let network = Network { chords, ..network };
            ring.measured(network, Forced { path: path.forced() });
            let (hop_us, window) = (network.hop_ns / 1000, choice::window(network));
            // 0: not measured, the hops being short (the cut is loopback's).
            let (bytes_per_us, folds_per_us) = (network.bytes_per_us, network.folds_per_us);
            let cuts = choice::describe_cuts(world, network);
            let log_depth = network.log_depth();
            let allreduce = path.name();
            info!(
                hop_us,
                bytes_per_us, folds_per_us, window, log_depth, cuts, allreduce, "network measured"
            );
            if path.needs_chords() && !chords {
                warn!(
                    "the allreduce path is forced to {path}, which needs chord streams, and \
                     this ring of {world} has none (formed from {} ranks): every allreduce \
                     takes the automatic path",
                    crate::topology::CHORDS_FROM_WORLD
                );
            }
            Ok(None)
        }
        Err(error) => {
            warn!(%error, "measuring the network failed; closing the ring");
            ring.abort(rank, &error, FIRST_PROBE_SEQ);
            match as_seen_by(rank, error) {
                aborted @ CollectiveError::Aborted { .. } => Ok(Some(aborted)),
                error => Err(connect_error(error, addresses, timeout)),
            }
        }
    }
}

/// A failure of the probes `connect` runs once the ring has formed, as a [`ConnectError`]
/// naming the rank at fault: a timeout as the rendezvous's own, anything else as an i/o error
/// with the collective's message.
fn connect_error(error: CollectiveError, addresses: &[String], timeout: Duration) -> ConnectError {
    let peer = error.peer().unwrap_or_default();
    let address = addresses[peer].clone();
    match error {
        CollectiveError::Timeout { .. } => ConnectError::Timeout {
            peer,
            address,
            waited: timeout,
            waiting_for: "to measure the network once the ring formed".into(),
        },
        CollectiveError::Io { kind, .. } => {
            ConnectError::Io { peer, address, kind, message: error.to_string() }
        }
        _ => ConnectError::Io {
            peer,
            address,
            kind: std::io::ErrorKind::ConnectionAborted,
            message: error.to_string(),
        },
    }
}

/// A hop's cost, in nanoseconds, from the time of one small allreduce on the gather path in a
/// world of `world` (which takes [`twoway::hops`] hops).
pub(crate) fn hop_from(call: Duration, world: usize) -> u64 {
    let hops = twoway::hops(world).max(1) as u128;
    u64::try_from(call.as_nanos() / hops).unwrap_or(u64::MAX)
}

/// The most bytes a rate probe takes in a world of `world`: as many as keep every segment one
/// slice ([`schedule::SLICE_BYTES`]), where the ring plan's time is the cost model's (its
/// gather goes both ways, `n - 1 + floor(n/2)` hops, and its window has no part in it).
fn one_slice_bytes(world: usize) -> usize {
    world.max(1).saturating_mul(schedule::SLICE_BYTES)
}

/// The bytes of each probe of the first round of rate probes in a world of `world`:
/// [`RATE_PROBE_BYTES`], or fewer where segments would be more than a slice
/// ([`one_slice_bytes`]: worlds 2 and 3).
pub(crate) fn rate_probe_bytes(world: usize) -> usize {
    RATE_PROBE_BYTES.min(one_slice_bytes(world))
}

/// The bytes of each probe of the second round of rate probes in a world of `world` at a hop of
/// `hop_ns`, from `first`, the agreed time of the first round (probes of
/// [`rate_probe_bytes`]); `None` where that round's bytes took at least as long as its hops,
/// so that the rate from it stands, or where no more bytes could be probed. Else as many
/// bytes as would take as long as the hops at the rate the first round gives, up to
/// [`LONGER_PROBE_MAX_BYTES`] and [`one_slice_bytes`] (the most where the hops took the whole
/// time); whole `u64`s.
pub(crate) fn longer_probe_bytes(first: Duration, world: usize, hop_ns: u64) -> Option<usize> {
    let low = rate_probe_bytes(world);
    let high = LONGER_PROBE_MAX_BYTES.min(one_slice_bytes(world));
    let ring = choice::traffic(Path::Ring, low, 8, world);
    let hops_ns = u128::from(ring.hops) * u128::from(hop_ns);
    let bytes_ns = first.as_nanos().saturating_sub(hops_ns);
    if bytes_ns >= hops_ns || high <= low {
        return None;
    }
    let want = match bytes_ns {
        0 => high,
        _ => usize::try_from(low as u128 * hops_ns / bytes_ns).unwrap_or(high),
    };
    Some(want.clamp(low, high) / 8 * 8)
}

/// The rate a rank sends its bytes, in bytes per microsecond, from `call`, the time of a
/// ring-path allreduce of `bytes` in a world of `world` at a hop of `hop_ns`, where ranks fold
/// at `folds_per_us`: the bytes the cost model says one rank sends ([`cost::traffic`]) over
/// the time left once its hops, and its folds at that rate, are taken off, so that the
/// model's time of that call (`ring::model_of`) is `call`. From 1 to [`MAX_BYTES_PER_US`]; the
/// most where the hops and folds take the whole time, or nothing moves.
pub(crate) fn rate_from(
    call: Duration,
    bytes: usize,
    world: usize,
    hop_ns: u64,
    folds_per_us: u64,
) -> u64 {
    let ring = choice::traffic(Path::Ring, bytes, 8, world);
    let n = world.max(1) as u128;
    let hops_ns = u128::from(ring.hops) * u128::from(hop_ns);
    // The model's fold time, `folded_n / n` bytes at `folds_per_us`, rounded down.
    let folds_ns = ring.folded_n * 1000 / (n * u128::from(folds_per_us.max(1)));
    let left_ns = call.as_nanos().saturating_sub(hops_ns).saturating_sub(folds_ns);
    if left_ns == 0 || ring.sent_n == 0 {
        return MAX_BYTES_PER_US;
    }
    // Per microsecond: × 1000 nanoseconds.
    let rate = ring.sent_n * 1000 / (n * left_ns);
    u64::try_from(rate).unwrap_or(MAX_BYTES_PER_US).clamp(1, MAX_BYTES_PER_US)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Driver, on_ring};

    #[test]
    fn a_failed_probe_is_a_connect_error_naming_the_rank() {
        let addresses: Vec<String> = (0..3).map(|r| format!("10.0.0.{r}:7000")).collect();
        let timeout = Duration::from_secs(9);
        let waited = Duration::from_secs(9);
        match connect_error(CollectiveError::Timeout { peer: 2, waited }, &addresses, timeout) {
            ConnectError::Timeout { peer: 2, address, waited, waiting_for } => {
                assert_eq!((address.as_str(), waited), ("10.0.0.2:7000", timeout));
                assert!(waiting_for.contains("measure the network"), "{waiting_for}");
            }
            other => panic!("{other}"),
        }
        let closed = CollectiveError::PeerClosed { peer: 1 };
        match connect_error(closed.clone(), &addresses, timeout) {
            ConnectError::Io { peer: 1, address, kind, message } => {
                assert_eq!(address, "10.0.0.1:7000");
                assert_eq!(kind, std::io::ErrorKind::ConnectionAborted);
                assert_eq!(message, closed.to_string());
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_hop_is_the_call_over_its_hops() {
        assert_eq!(hop_from(Duration::from_micros(30), 2), 30_000);
        assert_eq!(hop_from(Duration::from_micros(90), 7), 30_000, "three hops each way");
        assert_eq!(hop_from(Duration::from_micros(120), 8), 30_000, "four hops");
        assert_eq!(hop_from(Duration::MAX, 4), u64::MAX);
        assert_eq!(hop_from(Duration::ZERO, 1), 0);
    }

    #[test]
    fn a_rate_is_the_bytes_sent_over_the_time_the_hops_and_folds_leave() {
        // World 4: the ring's 5 hops, and each rank sends 2 × 3/4 of the buffer and folds 3/4.
        let (mib, hop_ns, folds) = (1 << 20, 200_000, 768);
        let (sent, folded) = (3 * mib / 2, 3 * mib / 4);
        let hops = Duration::from_millis(1);
        // Folds of 3/4 MiB at 768 B/us: 1,024 us more.
        let folds_time = Duration::from_micros(folded as u64 / folds);
        assert_eq!(folds_time, Duration::from_micros(1024));
        let call = hops + folds_time + Duration::from_micros(sent as u64 / 300);
        assert_eq!(rate_from(call, mib, 4, hop_ns, folds), 300);
        // Half the time left: twice the rate.
        let faster = hops + folds_time + Duration::from_micros(sent as u64 / 600);
        assert_eq!(rate_from(faster, mib, 4, hop_ns, folds), 600);
        // Folds twice as fast leave half a millisecond more to the bytes.
        let faster_folds = hops + folds_time / 2 + Duration::from_micros(sent as u64 / 600);
        let rate = rate_from(faster_folds, mib, 4, hop_ns, 2 * folds);
        assert_eq!(rate, 600, "the same sends: only the folds were faster");
        // Folds taken as costing nothing: the whole time after the hops is the bytes'.
        assert_eq!(rate_from(call, mib, 4, hop_ns, MAX_BYTES_PER_US), 251);
    }

    #[test]
    fn a_rate_stays_in_its_range_at_the_edges() {
        let (mib, hop_ns, folds) = (1 << 20, 200_000, MAX_BYTES_PER_US);
        let rate = |call, bytes, world, hop_ns| rate_from(call, bytes, world, hop_ns, folds);
        // The hops take the whole time, or more: nothing says the bytes cost anything.
        for call in [Duration::ZERO, Duration::from_millis(1), Duration::from_micros(999)] {
            assert_eq!(rate(call, mib, 4, hop_ns), MAX_BYTES_PER_US, "{call:?}");
        }
        // The hops and the folds take it: the same.
        let slow_folds = Duration::from_millis(1) + Duration::from_micros(768);
        // (3/4 MiB at 1,024 B/us: 768 us.)
        assert_eq!(rate_from(slow_folds, mib, 4, hop_ns, 1024), MAX_BYTES_PER_US);
        // Just past the hops: a huge rate, capped.
        let just_past = Duration::from_millis(1) + Duration::from_nanos(1);
        assert_eq!(rate(just_past, mib, 4, hop_ns), MAX_BYTES_PER_US);
        // A call that never ended, or no hop at all: the rate falls, never to 0; nor does a
        // fold rate of 0 (taken as 1) divide by 0.
        assert_eq!(rate(Duration::MAX, mib, 4, hop_ns), 1);
        assert_eq!(rate(Duration::MAX, mib, 4, u64::MAX), 1);
        assert_eq!(rate_from(Duration::MAX, mib, 4, hop_ns, 0), 1);
        assert_eq!(rate(Duration::from_millis(1), mib, 4, 0), 1574, "1.5 MiB in 999.25 us");
        // A world of one sends nothing.
        assert_eq!(rate(Duration::from_millis(1), mib, 1, hop_ns), MAX_BYTES_PER_US);
        assert_eq!(rate(Duration::from_millis(1), 0, 4, 0), MAX_BYTES_PER_US);
    }

    #[test]
    fn a_fold_rate_is_the_probes_bytes_over_its_time() {
        // 96 KiB in 96 us: 1 KiB a microsecond.
        assert_eq!(FOLD_PROBE_FOLDED, 96 << 10);
        assert_eq!(fold_rate_from(96_000), 1024);
        assert_eq!(fold_rate_from(48_000), 2048);
        // No time at all, or 0 taken as 1 ns: capped. Forever: never 0.
        assert_eq!(fold_rate_from(0), MAX_BYTES_PER_US);
        assert_eq!(fold_rate_from(1), MAX_BYTES_PER_US);
        assert_eq!(fold_rate_from(u64::MAX), 1);
        // The probe really folds: 96 KiB take well over the 96 ns that would read as the
        // highest rate (a fold the compiler dropped would take next to none).
        let ns = fold_probe_ns();
        assert!(fold_rate_from(ns) < MAX_BYTES_PER_US, "{ns} ns for 96 KiB");
    }

    #[test]
    fn a_first_rate_probe_keeps_its_segments_one_slice() {
        assert_eq!(rate_probe_bytes(2), 512 << 10);
        assert_eq!(rate_probe_bytes(3), 768 << 10);
        for world in [4, 5, 16, 1024, usize::MAX] {
            assert_eq!(rate_probe_bytes(world), RATE_PROBE_BYTES, "world {world}");
        }
        for world in 2..=64 {
            let len = rate_probe_bytes(world) / 8;
            assert_eq!(schedule::slices(len, world, 8), 1, "world {world}");
            if let Some(longer) = longer_probe_bytes(Duration::ZERO, world, 1) {
                assert_eq!(schedule::slices(longer / 8, world, 8), 1, "world {world}");
            }
        }
    }

    #[test]
    fn a_second_round_of_rate_probes_runs_where_the_first_ones_hops_outweighed_its_bytes() {
        // World 16 at 200 us: 23 hops, 4.6 ms.
        let (hops, hop_ns) = (Duration::from_micros(4600), 200_000);
        let longer = |first| longer_probe_bytes(first, 16, hop_ns);
        assert_eq!(longer(hops * 2), None, "bytes as long as the hops");
        assert_eq!(longer(hops * 9), None);
        // A quarter of the hops' time on bytes: four times the bytes.
        assert_eq!(longer(hops + hops / 4), Some(4 * RATE_PROBE_BYTES));
        // Next to nothing on bytes, or less than the hops: the most a world of 16 keeps in one
        // slice a segment (4 MiB).
        for first in [hops + Duration::from_nanos(1), hops, Duration::ZERO] {
            assert_eq!(longer(first), Some(16 * schedule::SLICE_BYTES), "{first:?}");
        }
        // Just under the hops' time on bytes: just over the first's bytes, whole u64s.
        let just = longer(hops * 2 - Duration::from_nanos(1)).unwrap();
        assert!(just >= RATE_PROBE_BYTES && just % 8 == 0 && just < RATE_PROBE_BYTES + 64);
        // From 64 ranks, the most is 16 MiB.
        assert_eq!(longer_probe_bytes(hops, 64, hop_ns), Some(LONGER_PROBE_MAX_BYTES));
        assert_eq!(longer_probe_bytes(hops, 1024, hop_ns), Some(LONGER_PROBE_MAX_BYTES));
        // No hop: nothing to outweigh. A hop of centuries: the most. Worlds of 2 to 4 probe
        // all they can in the first round.
        assert_eq!(longer(hops), Some(16 * schedule::SLICE_BYTES));
        assert_eq!(longer_probe_bytes(hops, 16, 0), None);
        assert_eq!(longer(Duration::MAX), None);
        assert_eq!(longer_probe_bytes(hops, 16, u64::MAX), Some(16 * schedule::SLICE_BYTES));
        for world in [2, 3, 4] {
            assert_eq!(longer_probe_bytes(Duration::ZERO, world, hop_ns), None, "world {world}");
        }
    }

    #[test]
    fn every_rank_agrees_on_one_network_and_so_on_one_window() {
        for world in [2, 3, 5, 8] {
            for rate_from_hop_ns in [0, u64::MAX] {
                let networks = on_ring(Driver::new(world), |rank, link| {
                    let mut scratch = Scratch::default();
                    let path = if rank == 1 { AllreducePath::Index } else { AllreducePath::Ring };
                    measure_from(link, rank, world, path, &mut scratch, rate_from_hop_ns).unwrap()
                });
                let first = &networks[0];
                let mut paths = vec![AllreducePath::Ring; world];
                paths[1] = AllreducePath::Index;
                assert_eq!(first.paths, paths, "world {world}: every rank's path, by rank");
                let rated = first.network.bytes_per_us != Network::UNMEASURED_RATE;
                assert_eq!(rated, rate_from_hop_ns == 0, "world {world}: {:?}", first.network);
                for (rank, agreed) in networks.iter().enumerate() {
                    assert_eq!(agreed, first, "world {world}: rank {rank} agreed on another one");
                    assert_eq!(choice::window(agreed.network), choice::window(first.network));
                }
            }
        }
    }

    #[test]
    fn the_probes_never_reach_a_callers_sequence_numbers() {
        // A caller would need 2^64 - 14 calls to reach the first probe.
        let last = FIRST_PROBE_SEQ.checked_add(PROBE_CALLS - 1).expect("the last seq fits");
        assert_eq!(last, u64::MAX);
        let longer_agreement = LONGER_RATE_SEQ + LONGER_RATE_PROBES;
        assert_eq!(longer_agreement, u64::MAX, "the second rate agreement is the last");
        assert!(FIRST_PROBE_SEQ > u64::from(u32::MAX));
    }
}
