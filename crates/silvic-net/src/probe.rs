//! What a ring measures of its network when it forms, for the choice (`ring::choice`): the cost
//! of a hop, the rate one stream carries, and the rate a rank folds; and the allreduce path
//! every rank was told to force (`options.rs`). One sequence ([`measure`]), which `connect`
//! runs over the TCP ring ([`settle`]) and the simulator over its virtual link, each handing in
//! its own clock and fold ([`Timed`]).
//!
//! The sequence, every call of it the same on every rank:
//!
//! 1. **The hop.** [`HOP_PROBES`] one-element allreduces (the gather path: `floor(n/2)` hops
//!    each, every rank in step with its neighbours); the fastest but the first (which also
//!    waits for the slowest rank to arrive) over its hops ([`hop_from`]).
//! 2. **The first agreement**, one allreduce (a max) of `3 + n` numbers: the slowest rank's
//!    hop, the slowest rank's fold of the fold probe ([`fold_probe_ns`]), the least time any
//!    rank has left before its `connect` deadline (as `u64::MAX` less it), and each rank's
//!    settings in its own place (every other rank gives 0 there): its forced path, its channel
//!    count and its usable cores in one number ([`settings_code`]).
//! 3. **A first estimate of the rate**, where that time allows ([`affords`]): [`RATE_PROBES`]
//!    shifts ([`ring::shift`]: every rank sends a block to its right neighbour, what a step of
//!    the ring moves) of [`FIRST_SHIFT_BYTES`], the first left out, the rest timed as one
//!    span ([`timed_shifts`]), and an agreement on the slowest rank's time a shift. Its rate
//!    ([`shift_rate`]: the bytes over the time less a hop, the hop at most half of it) is
//!    only an estimate: on a link whose bandwidth-delay product is near the block, the hop
//!    and whatever else a call costs once hide most of the bytes.
//! 4. **The rate**, where the time left allows: [`LONG_SHIFTS`] shifts of a block sized from
//!    the first estimate's bandwidth-delay product ([`long_shift_bytes`]: many times the bytes
//!    one hop holds, so latency cannot hide the rate), timed and agreed likewise from the end
//!    of the first round's agreement, where the ranks are in step; the rate is that round's
//!    ([`shift_rate`]). (A slope between the two rounds would take every fixed cost off, but
//!    a first round slowed by a neighbour's load makes it many times too high; the long
//!    round's bytes outweigh its fixed costs instead.)
//!
//! Where a round does not fit the time left, it is not run and the rate stays unmeasured (the
//! choice then takes loopback's figures): `connect` never runs past its timeout to measure.
//!
//! Invariants:
//! - The probes are calls of the ring's own plans, numbered from [`FIRST_PROBE_SEQ`] up to
//!   `u64::MAX`, a range no collective of the caller reaches: the caller's calls still count
//!   from 0, and a probe frame can never be taken for one of theirs.
//! - Every rank runs the same calls: each choice of what to probe next is a pure function of
//!   agreed numbers ([`affords`], [`shift_rate`], [`long_shift_bytes`],
//!   [`hop_from`]), and so is the result.
//! - The TCP ring runs them under `connect`'s deadline: a call still waiting on a peer at the
//!   deadline fails (`TcpRing::until`), so a peer that stalls while the ring measures costs
//!   `connect` its timeout, never more.
//! - A failure while probing is a failure of `connect`, naming the rank, and the ring is not
//!   handed out; except an abort from another rank (it failed, in a probe or already in its
//!   first call, since ranks leave the probes one after another), which `connect` hands out as
//!   a failed ring whose every call returns it.

use std::hint::black_box;
use std::time::{Duration, Instant};

use silvic_core::{CollectiveError, Dtype, Op, Reduction, fold};
use tracing::{debug, warn};

use crate::error::{ConnectError, as_seen_by};
use crate::link::TcpRing;
use crate::options::{self, AllreducePath, Channels, Settings};
use crate::ring::choice::{self, Forced};
use crate::ring::seam::{FramePlan, Network, Route};
use crate::ring::{self, Call, Link, Scratch, allreduce, bruck, twoway};

/// Timed probes of the hop. The first also waits for the slowest rank to arrive, so the fastest
/// of the rest is the figure.
pub(crate) const HOP_PROBES: u64 = 6;

/// Shifts of the first estimate of the rate, each of [`FIRST_SHIFT_BYTES`]; the first is left
/// out likewise.
pub(crate) const RATE_PROBES: u64 = 3;

/// Shifts of the rate's second round, each of [`long_shift_bytes`]; all timed (the ranks are in
/// step by then).
pub(crate) const LONG_SHIFTS: u64 = 3;

/// Every call `connect` may run once the ring forms: the hop's probes and the first agreement,
/// then each round of shifts and its agreement.
pub(crate) const PROBE_CALLS: u64 = HOP_PROBES + 1 + RATE_PROBES + 1 + LONG_SHIFTS + 1;

/// The sequence number of the first probe; the rest follow it, the last at `u64::MAX`.
pub(crate) const FIRST_PROBE_SEQ: u64 = u64::MAX - (PROBE_CALLS - 1);

/// The sequence number of the first agreement, after the hop's probes.
const AGREEMENT_SEQ: u64 = FIRST_PROBE_SEQ + HOP_PROBES;

/// The sequence number of the first shift; the round's agreement follows its last.
const FIRST_SHIFT_SEQ: u64 = AGREEMENT_SEQ + 1;

/// The sequence number of the first long shift; the round's agreement follows its last.
const LONG_SHIFT_SEQ: u64 = FIRST_SHIFT_SEQ + RATE_PROBES + 1;

/// The op every agreement and hop probe runs as (a shift's frames are an allgather's).
const PROBE_OP: Op = Op::Allreduce { reduction: Reduction::Max, dtype: Dtype::U64 };

/// The numbers of the first agreement before the ranks' settings: the hop, the fold, the time
/// left.
const AGREED_FIXED: usize = 3;

/// A rank's settings as one number of the first agreement: its path's code
/// ([`AllreducePath::code`]) in bits 0-7, its channel count's ([`Channels::code`]) in bits
/// 8-15, and its usable cores above (at most `2^32 - 1`). Never 0, which is no rank's.
pub(crate) fn settings_code(settings: Settings, cores: usize) -> u64 {
    let cores = u64::try_from(cores).unwrap_or(u64::MAX).clamp(1, u64::from(u32::MAX));
    cores << 16 | settings.channels.code() << 8 | settings.allreduce.code()
}

/// The path, channel count and cores codes of a settings number ([`settings_code`]).
fn settings_of(code: u64) -> (u64, u64, u64) {
    (code & 0xff, (code >> 8) & 0xff, code >> 16)
}

/// The block of each shift of the first estimate: past a loopback hop's bytes many times over.
pub(crate) const FIRST_SHIFT_BYTES: usize = 256 << 10;

/// How many hops' worth of bytes at the first estimate a long shift carries: enough that the
/// hop is a small part of its time.
pub(crate) const HOPS_OF_BYTES: u64 = 8;

/// The least a long shift carries, in first shifts: 4 MiB, past what a loopback stream's
/// socket buffers take in at once, so that a shift on a fast link times the stream's bytes
/// and not the buffers filling.
pub(crate) const LONG_SHIFT_MIN_FACTOR: usize = 16;

/// The most bytes of a long shift: the time `connect` spends on it.
pub(crate) const LONG_SHIFT_MAX_BYTES: usize = 8 << 20;

/// The most bytes of one frame of a shift: a shift holds two buffers of this many, whatever its
/// length (the ring path's slice: frames of it cost next to nothing beyond their bytes).
pub(crate) const SHIFT_FRAME_BYTES: usize = 256 << 10;

/// The highest rate [`shift_rate`] and [`fold_rate_from`] give, in bytes per
/// microsecond (about 1 TB/s): what a probe whose time its fixed costs alone account for comes
/// to. It keeps the cost model's integers far from overflowing.
pub(crate) const MAX_BYTES_PER_US: u64 = 1 << 20;

/// The rate a round's time is estimated at before any was measured, in bytes per microsecond
/// (80 Mbit/s): slower than any network a ring is formed over.
const GUESS_BYTES_PER_US: u64 = 10;

/// A round of probes runs only where this many times its estimated time fits in the time left.
const ROOM: u64 = 4;

/// The buffers of the fold probe ([`fold_probe_ns`]): the gather path's fold of this many
/// ranks' blocks of [`FOLD_PROBE_BLOCK_BYTES`], so `(FOLD_PROBE_RANKS - 1)` blocks folded.
const FOLD_PROBE_RANKS: usize = 4;

/// The block of each rank the fold probe folds, as large as the histograms trainers fold.
const FOLD_PROBE_BLOCK_BYTES: usize = 32 << 10;

/// Folds in one timed run of the fold probe; the fastest of [`FOLD_PROBE_RUNS`] runs counts.
const FOLD_PROBE_FOLDS: u64 = 16;
const FOLD_PROBE_RUNS: usize = 3;

/// The bytes one fold of the fold probe folds.
pub(crate) const FOLD_PROBE_FOLDED: u64 = ((FOLD_PROBE_RANKS - 1) * FOLD_PROBE_BLOCK_BYTES) as u64;

/// A link the probes run over, with what they read beside it: a clock, a fold to time, and the
/// time left before the deadline of what they are part of.
pub(crate) trait Timed: Link {
    /// The time on this rank's clock, from any start.
    fn now(&self) -> Duration;
    /// How long this rank takes to fold [`FOLD_PROBE_FOLDED`] bytes, in nanoseconds.
    fn fold_ns(&mut self) -> u64;
    /// The time left before this rank's deadline.
    fn left(&self) -> Duration;
}

/// What every rank agreed on when the ring formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Measured {
    /// The network (without its chords: the link knows those).
    pub(crate) network: Network,
    /// Every rank's forced path, by rank, as [`AllreducePath::code`] numbers them.
    pub(crate) paths: Vec<u64>,
    /// Every rank's channel count, by rank, as [`Channels::code`] numbers them.
    pub(crate) channels: Vec<u64>,
    /// The fewest cores any rank may use ([`usable_cores`]), at least 1.
    pub(crate) cores: u64,
}

/// The cores this rank may use for its channels: what `available_parallelism` allows it (cgroup
/// quotas included), shared among the ranks that advertise its address (ranks of one host,
/// which run on the same cores), at least 1.
pub(crate) fn usable_cores(rank: usize, addresses: &[std::net::SocketAddr]) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let host = addresses[rank].ip();
    let sharing = addresses.iter().filter(|a| a.ip() == host).count().max(1);
    (cores / sharing).max(1)
}

/// A duration in whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Measures the ring's network over `link` and agrees on it, and on every rank's settings and
/// usable `cores`, with every rank (see the module doc).
pub(crate) fn measure<L: Timed>(
    link: &mut L,
    rank: usize,
    world: usize,
    (settings, cores): (Settings, usize),
    scratch: &mut Scratch,
) -> Result<Measured, CollectiveError> {
    let call = |seq| Call { rank, world, op: PROBE_OP, seq };
    let mut fastest = Duration::MAX;
    for i in 0..HOP_PROBES {
        let mut one = [0u64];
        let started = link.now();
        allreduce(link, call(FIRST_PROBE_SEQ + i), &mut one, fold::max_int, scratch)?;
        if i > 0 {
            fastest = fastest.min(link.now().saturating_sub(started));
        }
    }
    let mut agreed = vec![0; AGREED_FIXED + world];
    agreed[0] = hop_from(fastest, world);
    agreed[1] = link.fold_ns();
    agreed[2] = u64::MAX - nanos(link.left());
    agreed[AGREED_FIXED + rank] = settings_code(settings, cores);
    allreduce(link, call(AGREEMENT_SEQ), &mut agreed, fold::max_int, scratch)?;
    let (hop_ns, fold_ns, left_ns) = (agreed[0], agreed[1], u64::MAX - agreed[2]);
    let codes: Vec<(u64, u64, u64)> =
        agreed.split_off(AGREED_FIXED).into_iter().map(settings_of).collect();
    let paths = codes.iter().map(|c| c.0).collect();
    let channels = codes.iter().map(|c| c.1).collect();
    let cores = codes.iter().map(|c| c.2).min().unwrap_or(1).max(1);
    let mut network = Network { hop_ns, ..Network::UNMEASURED };
    let first = FIRST_SHIFT_BYTES;
    if world > 1 && affords(left_ns, round_ns(RATE_PROBES, first, hop_ns, GUESS_BYTES_PER_US)) {
        let seqs = FIRST_SHIFT_SEQ..FIRST_SHIFT_SEQ + RATE_PROBES;
        let (short, left_ns) = timed_shifts(link, (rank, world), seqs, 1, first, scratch)?;
        let mut rate = shift_rate(short, first, hop_ns);
        let long = long_shift_bytes(hop_ns, estimate_rate(short, first, hop_ns));
        if affords(left_ns, round_ns(LONG_SHIFTS, long, hop_ns, rate)) {
            let seqs = LONG_SHIFT_SEQ..LONG_SHIFT_SEQ + LONG_SHIFTS;
            let (time, _) = timed_shifts(link, (rank, world), seqs, 0, long, scratch)?;
            rate = shift_rate(time, long, hop_ns);
        }
        network.bytes_per_us = rate;
        network.folds_per_us = fold_rate_from(fold_ns);
    }
    Ok(Measured { network, paths, channels, cores })
}

/// Times a shift of `bytes` as each call numbered in `seqs`, the first `left_out` not counted,
/// and agrees with the next call on the slowest rank's time a shift and on the least time any
/// rank has left: returns both.
///
/// A rank's time a shift is its counted shifts' span over their number, not its fastest shift:
/// ranks leave a shift one after another, and a rank that starts one late finds part of its
/// block already in its socket buffers, so its fastest shift may time the buffers, not the
/// stream (where many ranks share few cores, a rate several times what the ring then carries,
/// docs/paths.md). Over the span, the bytes a neighbour sent ahead are counted once, at its
/// start; and the slowest rank's span ends with the last bytes any rank received.
fn timed_shifts<L: Timed>(
    link: &mut L,
    (rank, world): (usize, usize),
    mut seqs: std::ops::Range<u64>,
    left_out: usize,
    bytes: usize,
    scratch: &mut Scratch,
) -> Result<(Duration, u64), CollectiveError> {
    let agreement = Call { rank, world, op: PROBE_OP, seq: seqs.end };
    let frame = bytes.min(SHIFT_FRAME_BYTES);
    let (out, mut into) = (vec![rank as u8; frame], vec![0u8; frame]);
    let mut shift = |link: &mut L, seq| {
        ring::shift::shift(link, Call { seq, ..agreement }, bytes as u64, &out, &mut into)
    };
    for seq in seqs.by_ref().take(left_out) {
        shift(link, seq)?;
    }
    let (started, counted) = (link.now(), seqs.end - seqs.start);
    for seq in seqs {
        shift(link, seq)?;
    }
    let per_shift = nanos(link.now().saturating_sub(started)) / counted.max(1);
    let mut slowest = [per_shift, u64::MAX - nanos(link.left())];
    allreduce(link, agreement, &mut slowest, fold::max_int, scratch)?;
    Ok((Duration::from_nanos(slowest[0]), u64::MAX - slowest[1]))
}

/// What a round of `calls` shifts of `bytes` and its agreement take at a hop of `hop_ns` and
/// `bytes_per_us`, in nanoseconds: each shift a hop and its bytes, and the agreement's hops
/// (taken as a shift's, generously: a small allreduce is `floor(n/2)` hops, and the agreement
/// is ahead of a whole round).
pub(crate) fn round_ns(calls: u64, bytes: usize, hop_ns: u64, bytes_per_us: u64) -> u64 {
    let bytes_ns = (bytes as u64).saturating_mul(1000) / bytes_per_us.max(1);
    let shift = hop_ns.saturating_add(bytes_ns);
    shift.saturating_mul(calls + 1)
}

/// Whether a round estimated at `round_ns` fits, [`ROOM`] times over, in `left_ns`.
pub(crate) fn affords(left_ns: u64, round_ns: u64) -> bool {
    round_ns.saturating_mul(ROOM) <= left_ns
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

/// A rate in bytes per microsecond: `bytes` over `ns`, from 1 to [`MAX_BYTES_PER_US`] (the
/// most where no time is left to the bytes).
fn per_us(bytes: u64, ns: u128) -> u64 {
    if ns == 0 {
        return MAX_BYTES_PER_US;
    }
    let rate = u128::from(bytes) * 1000 / ns;
    u64::try_from(rate).unwrap_or(MAX_BYTES_PER_US).clamp(1, MAX_BYTES_PER_US)
}

/// What a first shift of `bytes` in `time` at a hop of `hop_ns` says of the rate, to size the
/// long shift by: the bytes over the time less the whole hop. Where the hop was measured slow
/// it may say far too much, and the long shift is only the longer for it.
pub(crate) fn estimate_rate(time: Duration, bytes: usize, hop_ns: u64) -> u64 {
    per_us(bytes as u64, time.as_nanos().saturating_sub(u128::from(hop_ns)))
}

/// The rate of one stream from `time`, the agreed time of a shift of `bytes` at a hop of
/// `hop_ns`: the bytes over what is left of the time once the hop is taken off, the hop taking
/// at most half of it. (A hop measured slow on a loaded machine, against a shift that ran
/// fast, would otherwise leave next to no time to the bytes, and a rate a thousand times the
/// link's; a long shift's hop is a small part of its time, so the bound changes nothing there.)
pub(crate) fn shift_rate(time: Duration, bytes: usize, hop_ns: u64) -> u64 {
    let time = time.as_nanos();
    per_us(bytes as u64, time - u128::from(hop_ns).min(time / 2))
}

/// The block of a long shift at a hop of `hop_ns` and a first estimate of `bytes_per_us`:
/// [`HOPS_OF_BYTES`] times the bytes one hop holds (the bandwidth-delay product), at least
/// [`LONG_SHIFT_MIN_FACTOR`] first shifts and at most [`LONG_SHIFT_MAX_BYTES`]; whole `u64`s.
pub(crate) fn long_shift_bytes(hop_ns: u64, bytes_per_us: u64) -> usize {
    let in_flight = u128::from(hop_ns) * u128::from(bytes_per_us) / 1000;
    let want = usize::try_from(in_flight * u128::from(HOPS_OF_BYTES)).unwrap_or(usize::MAX);
    let least = LONG_SHIFT_MIN_FACTOR * FIRST_SHIFT_BYTES;
    want.clamp(least, LONG_SHIFT_MAX_BYTES) / 8 * 8
}

/// A hop's cost, in nanoseconds, from the time of one small allreduce on the gather path in a
/// world of `world` (which takes [`twoway::hops`] hops).
pub(crate) fn hop_from(call: Duration, world: usize) -> u64 {
    let hops = twoway::hops(world).max(1) as u128;
    u64::try_from(call.as_nanos() / hops).unwrap_or(u64::MAX)
}

/// Every rank's channel count from the agreement's `codes` (by rank).
fn counts_of(codes: &[u64]) -> Result<Vec<Channels>, CollectiveError> {
    let count_of = |(r, &code): (usize, &u64)| {
        Channels::from_code(code).ok_or_else(|| CollectiveError::MalformedFrame {
            peer: r,
            reason: format!("the agreement gives rank {r} channel number {code}, which names none"),
        })
    };
    codes.iter().enumerate().map(count_of).collect()
}

/// Every rank's forced path from the agreement's `codes` (by rank).
fn paths_of(codes: &[u64]) -> Result<Vec<AllreducePath>, CollectiveError> {
    let path_of = |(r, &code): (usize, &u64)| {
        AllreducePath::from_code(code).ok_or_else(|| CollectiveError::MalformedFrame {
            peer: r,
            reason: format!("the agreement gives rank {r} path number {code}, which names none"),
        })
    };
    codes.iter().enumerate().map(path_of).collect()
}

/// The TCP ring as the probes see it: its clock, and `connect`'s deadline.
struct OnClock<'r> {
    ring: &'r mut TcpRing,
    start: Instant,
    deadline: Instant,
}

impl Link for OnClock<'_> {
    fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
        self.ring.run(plan)
    }
    fn network(&self) -> Network {
        self.ring.network()
    }
    fn forced(&self) -> Forced {
        self.ring.forced()
    }
}

impl Timed for OnClock<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
    fn fold_ns(&mut self) -> u64 {
        fold_probe_ns()
    }
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// How long a ring whose probes failed lingers when `connect` drops it: `connect` returns
/// within its timeout and this.
const FAILED_LINGER: Duration = Duration::from_millis(500);

/// Measures the network of a ring `connect` has just formed, before `deadline` (each probe
/// call fails once it waits past it), agrees on the allreduce path (this rank's is `path`),
/// and hands both to the ring. `Ok(None)` once measured; `Ok(Some(error))` when another rank
/// failed first (an abort came, see the module doc), for the ring to be handed out failed;
/// `Err` naming the rank at fault otherwise, or [`ConnectError::Disagreement`] on every rank
/// where the paths differ. On a failure of a probe the neighbours are told and the streams
/// shut, and the ring, once dropped, lingers at most [`FAILED_LINGER`].
pub(crate) fn settle(
    ring: &mut TcpRing,
    (rank, settings, cores): (usize, Settings, usize),
    scratch: &mut Scratch,
    addresses: &[String],
    (timeout, deadline): (Duration, Instant),
) -> Result<Option<CollectiveError>, ConnectError> {
    let world = addresses.len();
    ring.until(Some(deadline));
    let start = Instant::now();
    let mut link = OnClock { ring, start, deadline };
    let measured = measure(&mut link, rank, world, (settings, cores), scratch);
    ring.until(None);
    let agreed = measured
        .and_then(|m| Ok((m.network, paths_of(&m.paths)?, counts_of(&m.channels)?, m.cores)));
    match agreed {
        Ok((network, paths, counts, cores)) => {
            // Every rank has the same list, so every rank fails alike: nobody waits on another.
            let path = options::agreed(&paths)?;
            let spread = choice::Spread::of(options::agreed_channels(&counts)?, cores);
            // Every rank formed the same topology, so every rank finds the same routes.
            let chords = world > 1
                && (0..bruck::rounds(world)).map(bruck::route).all(|route| {
                    ring.carries(route) && ring.carries(Route { offset: -route.offset })
                });
            let network = Network { chords, ..network };
            ring.measured(network, Forced { path: path.forced(), spread });
            let (hop_us, window) = (network.hop_ns / 1000, choice::window(network));
            // 0: not measured (no time for it, or a world of one). A debug line: its zeros and
            // cuts mean something to a developer, and read like a fault to anyone else.
            let (bytes_per_us, folds_per_us) = (network.bytes_per_us, network.folds_per_us);
            let cuts = choice::describe_cuts(world, network);
            let log_depth = network.log_depth();
            let allreduce = path.name();
            let channels = spread.most();
            debug!(
                hop_us,
                bytes_per_us,
                folds_per_us,
                window,
                log_depth,
                cuts,
                allreduce,
                cores,
                channels,
                "network measured"
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
                error => {
                    ring.set_timeout(FAILED_LINGER.min(timeout));
                    Err(connect_error(error, addresses, timeout))
                }
            }
        }
    }
}

/// A failure of the probes `connect` runs once the ring has formed, as a [`ConnectError`]
/// naming the rank at fault: a timeout as the rendezvous's own, this rank's cancel as the
/// start's, anything else as an i/o error with the collective's message.
fn connect_error(error: CollectiveError, addresses: &[String], timeout: Duration) -> ConnectError {
    let peer = error.peer().unwrap_or_default();
    let address = addresses[peer].clone();
    match error {
        CollectiveError::Cancelled => ConnectError::Cancelled,
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
    fn a_shifts_rate_is_its_bytes_over_its_time_less_a_hop_and_a_long_one_hides_fixed_costs() {
        // 256 KiB in 1 ms after a hop of 500 us: 262 B/us.
        let first = Duration::from_micros(1500);
        assert_eq!(shift_rate(first, 256 << 10, 500_000), 262);
        // A fixed cost the hop does not count (a wake-up, a slow first frame) of 300 us in every
        // shift: the first estimate falls by a fifth, a long shift (eight hops' worth of bytes
        // at that estimate) by a few percent.
        let at = |bytes: usize| Duration::from_micros(500 + 300 + bytes as u64 / 262);
        let estimate = shift_rate(at(256 << 10), 256 << 10, 500_000);
        assert_eq!(estimate, 201);
        let long = long_shift_bytes(500_000, estimate);
        assert_eq!(long, LONG_SHIFT_MIN_FACTOR * FIRST_SHIFT_BYTES, "804 KB: the least is more");
        let rate = shift_rate(at(long), long, 500_000);
        assert!((240..=262).contains(&rate), "{rate}");
    }

    #[test]
    fn rates_stay_in_their_range_at_the_edges() {
        let mib = 1 << 20;
        // The hop would take the whole time, or more (a hop measured slow on a loaded
        // machine): it takes half, so the rate is twice the bytes over the time, never a
        // thousand times the link's.
        for us in [500, 499, 100] {
            let time = Duration::from_micros(us);
            assert_eq!(shift_rate(time, mib, 500_000), 2 * mib as u64 / us, "{time:?}");
        }
        assert_eq!(shift_rate(Duration::ZERO, mib, 500_000), MAX_BYTES_PER_US);
        // A call that never ended, or a hop of centuries: the rate falls, never to 0.
        assert_eq!(shift_rate(Duration::MAX, mib, 500_000), 1);
        assert_eq!(shift_rate(Duration::MAX, mib, u64::MAX), 1);
        assert_eq!(shift_rate(Duration::from_millis(4), 0, 0), 1, "no bytes: the least");
    }

    #[test]
    fn a_long_shift_holds_many_hops_of_bytes_within_its_bounds() {
        let least = LONG_SHIFT_MIN_FACTOR * FIRST_SHIFT_BYTES;
        // 500 us at 1500 B/us: 750 KB a hop, 6 MB a long shift.
        assert_eq!(long_shift_bytes(500_000, 1500), 6_000_000);
        // A relay bed's 500 us at 300 B/us: 150 KB a hop, and the least is more.
        assert_eq!(long_shift_bytes(500_000, 300), least);
        // Loopback's short hops: the least.
        assert_eq!(long_shift_bytes(30_000, 1500), least);
        assert_eq!(long_shift_bytes(0, 0), least);
        // A fast long link: the most.
        assert_eq!(long_shift_bytes(1_000_000, 12_500), LONG_SHIFT_MAX_BYTES);
        assert_eq!(long_shift_bytes(u64::MAX, MAX_BYTES_PER_US), LONG_SHIFT_MAX_BYTES);
        for (hop_ns, rate) in [(123_457, 777), (99_999, 3), (700_001, 1001)] {
            assert_eq!(long_shift_bytes(hop_ns, rate) % 8, 0, "whole u64s");
        }
    }

    #[test]
    fn a_round_runs_only_where_it_fits_in_the_time_left_several_times_over() {
        // Three shifts of 256 KiB at 10 B/us behind 1 ms hops, and the agreement: 4 × 27.2 ms.
        let round = round_ns(3, 256 << 10, 1_000_000, 10);
        assert_eq!(round, 4 * (1_000_000 + 26_214_400));
        assert!(affords(ROOM * round, round));
        assert!(!affords(ROOM * round - 1, round));
        assert!(affords(u64::MAX, round), "the simulator's rings have all the time there is");
        assert!(!affords(0, 1));
        assert!(!affords(u64::MAX - 1, round_ns(3, usize::MAX, u64::MAX, 0)), "saturates");
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

    /// An in-memory rank with a clock of its own: its `n`th call takes `took(n)` on it, from
    /// zero, and its folds take `fold_ns`; `left` is its time to the deadline.
    struct Clocked<'a> {
        link: &'a mut dyn Link,
        clock: Duration,
        calls: usize,
        took: &'a dyn Fn(usize) -> Duration,
        fold_ns: u64,
        left: Duration,
    }

    impl<'a> Clocked<'a> {
        fn new(
            link: &'a mut dyn Link,
            took: &'a dyn Fn(usize) -> Duration,
            fold_ns: u64,
            left: Duration,
        ) -> Self {
            Clocked { link, clock: Duration::ZERO, calls: 0, took, fold_ns, left }
        }
    }

    impl Link for Clocked<'_> {
        fn run(&mut self, plan: &mut dyn FramePlan) -> Result<(), CollectiveError> {
            self.clock += (self.took)(self.calls);
            self.calls += 1;
            self.link.run(plan)
        }
        fn network(&self) -> Network {
            self.link.network()
        }
    }

    impl Timed for Clocked<'_> {
        fn now(&self) -> Duration {
            self.clock
        }
        fn fold_ns(&mut self) -> u64 {
            self.fold_ns
        }
        fn left(&self) -> Duration {
            self.left
        }
    }

    /// A rank's path, channel count and cores share one number of the agreement and come apart
    /// again for every value each may take.
    #[test]
    fn settings_codes_hold_every_path_and_channel_count_apart() {
        let counts = (1..=crate::options::MAX_CHANNELS).map(Channels::Forced);
        for channels in std::iter::once(Channels::Auto).chain(counts) {
            for allreduce in AllreducePath::ALL {
                for cores in [1, 2, 17, 1 << 20, usize::MAX] {
                    let code = settings_code(Settings { allreduce, channels }, cores);
                    let (path, count, cores_code) = settings_of(code);
                    assert_eq!(AllreducePath::from_code(path), Some(allreduce));
                    assert_eq!(Channels::from_code(count), Some(channels));
                    let expected = (cores as u64).min(u64::from(u32::MAX));
                    assert_eq!(cores_code, expected);
                }
            }
        }
    }

    #[test]
    fn every_rank_agrees_on_one_network_though_each_clock_says_another() {
        for world in [2, 3, 5, 8] {
            let measured = on_ring(Driver::new(world), |rank, link| {
                let per_call = Duration::from_micros(100 + 10 * rank as u64);
                let fold_ns = 1000 + rank as u64;
                let left = Duration::from_secs(100 + rank as u64);
                let took = |_| per_call;
                let mut link = Clocked::new(link, &took, fold_ns, left);
                let path = if rank == 1 { AllreducePath::Index } else { AllreducePath::Ring };
                let channels = if rank == 1 { Channels::Forced(3) } else { Channels::Auto };
                let cores = if rank == world - 1 { 2 } else { 4 + rank };
                let settings = Settings { allreduce: path, channels };
                measure(&mut link, rank, world, (settings, cores), &mut Scratch::default()).unwrap()
            });
            let first = &measured[0];
            let mut paths = vec![AllreducePath::Ring.code(); world];
            paths[1] = AllreducePath::Index.code();
            assert_eq!(first.paths, paths, "world {world}: every rank's path, by rank");
            let mut channels = vec![Channels::Auto.code(); world];
            channels[1] = Channels::Forced(3).code();
            assert_eq!(first.channels, channels, "world {world}: every rank's channels");
            assert_eq!(first.cores, 2, "world {world}: the fewest cores of any rank");
            // The slowest rank's figures: its hop probe over its hops, its fold.
            let slowest = Duration::from_micros(100 + 10 * (world as u64 - 1));
            assert_eq!(first.network.hop_ns, hop_from(slowest, world), "world {world}");
            assert_eq!(first.network.folds_per_us, fold_rate_from(1000 + world as u64 - 1));
            assert_ne!(first.network.bytes_per_us, Network::UNMEASURED_RATE, "world {world}");
            for (rank, agreed) in measured.iter().enumerate() {
                assert_eq!(agreed, first, "world {world}: rank {rank} agreed on another one");
            }
        }
    }

    #[test]
    fn a_round_of_shifts_is_timed_as_one_span_not_by_its_fastest_shift() {
        // The long round's shifts take 9, 1 and 2 ms, as where a rank that started late found
        // most of a block in its buffers: the rate is the round's 4 ms a shift, not 1 ms's.
        const LONG: usize = (HOP_PROBES + 1 + RATE_PROBES + 1) as usize;
        let took = |call: usize| match call.checked_sub(LONG) {
            Some(0) => Duration::from_millis(9),
            Some(1) => Duration::from_millis(1),
            Some(2) => Duration::from_millis(2),
            _ => Duration::from_micros(100),
        };
        let world = 4;
        let measured = on_ring(Driver::new(world), |rank, link| {
            let mut link = Clocked::new(link, &took, 1000, Duration::from_secs(100));
            let settings = (Settings::default(), 1);
            let measured = measure(&mut link, rank, world, settings, &mut Scratch::default());
            (measured.unwrap(), link.calls)
        });
        let hop_ns = hop_from(Duration::from_micros(100), world);
        let first = estimate_rate(Duration::from_micros(100), FIRST_SHIFT_BYTES, hop_ns);
        let long = long_shift_bytes(hop_ns, first);
        let rate = shift_rate(Duration::from_millis(4), long, hop_ns);
        assert_ne!(rate, shift_rate(Duration::from_millis(1), long, hop_ns));
        for (rank, (agreed, calls)) in measured.into_iter().enumerate() {
            assert_eq!(calls as u64, PROBE_CALLS, "rank {rank} ran every probe");
            assert_eq!(agreed.network.hop_ns, hop_ns, "rank {rank}");
            assert_eq!(agreed.network.bytes_per_us, rate, "rank {rank}");
        }
    }

    #[test]
    fn without_the_time_for_it_no_rank_measures_the_rate() {
        // One rank has 50 ms left: too little for three shifts at the guessed rate, so no rank
        // runs them (each would wait for the others), and the rate stays unmeasured.
        let world = 4;
        let measured = on_ring(Driver::new(world), |rank, link| {
            let left = if rank == 2 { Duration::from_millis(50) } else { Duration::from_secs(60) };
            let per_call = Duration::from_micros(100);
            let took = |_| per_call;
            let mut link = Clocked::new(link, &took, 1, left);
            measure(&mut link, rank, world, (Settings::default(), 1), &mut Scratch::default())
                .unwrap()
        });
        for agreed in measured {
            assert_eq!(agreed.network.bytes_per_us, Network::UNMEASURED_RATE);
            assert_eq!(agreed.network.folds_per_us, Network::UNMEASURED_RATE);
            assert_eq!(agreed.network.hop_ns, 50_000);
        }
    }

    #[test]
    fn the_probes_never_reach_a_callers_sequence_numbers() {
        // A caller would need 2^64 - 15 calls to reach the first probe.
        let last = FIRST_PROBE_SEQ.checked_add(PROBE_CALLS - 1).expect("the last seq fits");
        assert_eq!(last, u64::MAX);
        let long_agreement = LONG_SHIFT_SEQ + LONG_SHIFTS;
        assert_eq!(long_agreement, u64::MAX, "the second round's agreement is the last");
        assert!(FIRST_PROBE_SEQ > u64::from(u32::MAX));
    }

    #[test]
    fn a_path_number_that_names_none_is_refused_naming_its_rank() {
        let codes = [AllreducePath::Ring.code(), 0, AllreducePath::Auto.code()];
        let error = paths_of(&codes).unwrap_err();
        assert_eq!(error.peer(), Some(1));
        assert!(error.to_string().contains("path number 0"), "{error}");
        assert_eq!(paths_of(&codes[2..]), Ok(vec![AllreducePath::Auto]));
    }
}
