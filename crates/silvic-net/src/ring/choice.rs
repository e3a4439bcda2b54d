//! The choice of an allreduce's path, in one room: what the ranks measured of their network
//! ([`Network`], agreed when the ring formed, `probe.rs`), the cost model over every path
//! ([`Model`], [`traffic`]: hops, bytes sent and folded and frames queued per rank), and the
//! rule that picks a path from them ([`choose`]), as pure functions of the call's size, its
//! element size, the world, the topology (whether chord streams exist) and the measured
//! network.
//!
//! | path | hops | bytes sent per rank | bytes folded per rank | frames queued |
//! |---|---|---|---|---|
//! | gather (two-way) | `floor(n/2)` | `(n - 1) S` | `(n - 1) S` | 0 |
//! | ring | `n - 1 + floor(n/2)` | `2 (n - 1) S / n` | `(n - 1) S / n` | 0 |
//! | Bruck gather | `L = ceil(log2 n)` | `(n - 1) S` | `(n - 1) S` | `n - 1 - L` |
//! | index-fold-gather | `L × (chunks + 1)` | `(P(n) + n - 1) S / n` | `(n - 1) S / n` | `Q` |
//!
//! `P(n)` is the number of set bits in `0..n` (the index's slots sent, about `n log2(n) / 2`),
//! `chunks` the index's chunks ([`chunks`]) and `Q = chunks × (P(n) - L) + n - 1 - L`. The
//! frames queued are those a rank sends on a way behind the first of their round: a log-depth
//! round sends many frames to one peer, one after another, where the gather's and the ring's
//! steps send one frame a way (the ring's slices of large calls aside, whose bytes dwarf a
//! frame's cost). Each costs [`FRAME_COST_BYTES`] at the rate, beyond its bytes
//! ([`scaled_time`]). The two gathering paths hold `n × S`, so they are candidates only where
//! the gather path's memory bound allows ([`GATHER_MAX_BYTES`], every size below
//! [`SMALL_BYTES`]).
//!
//! Invariants:
//! - **The same on every rank.** Every input is the same on every rank (the network is agreed,
//!   the forced path too), and the time is computed exactly, in integers scaled by `n ×` the
//!   rates, ties to the earlier candidate: every rank picks the same path for the same call.
//! - **Today's cut extended.** With no fold cost and the loopback constants, the gather-or-ring
//!   choice is [`uses_gather_at`]'s at loopback's hop (the tests check it). Where hops are short, the cut is made at
//!   the measured hop where it is shorter than loopback's ([`short_hop_ns`]), else at
//!   loopback's. Where hops are long, the model at the measured hop and rate picks among the
//!   gather and the ring, and among every path where the link has chord streams.
//! - **Bits never depend on it.** Every path folds every element in the same order, so the
//!   choice decides speed and memory only.
//!
//! A new path is a [`Path`] (its wire code and name in `frame/`), its row in [`traffic`] and
//! [`fits`] here, and its plan file in `ring/`. Not here: running a plan, or measuring.

use super::log_depth::{STORE_MAX_BYTES, chunks, rounds};
use super::schedule;
pub(crate) use crate::frame::Path;

/// One allreduce as the choice sees it: its bytes, the bytes of one element, and the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) bytes: usize,
    pub(crate) elem: usize,
    pub(crate) world: usize,
}

/// What every rank of a ring agreed to force on its allreduces (`SILVIC_ALLREDUCE`,
/// `options.rs`), and the channels it may split them over (`SILVIC_CHANNELS`), the same on
/// every rank. The default forces nothing and splits nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Forced {
    /// The path every call takes where that path [`carries`] it.
    pub(crate) path: Option<Path>,
    /// The channels a split call may run on.
    pub(crate) spread: Spread,
}

/// The channels a ring's large calls may run on, agreed at connect: each channel a thread and
/// a stream to each ring neighbour (`channels.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Spread {
    /// One: no call is split (the default, and every link without channels).
    #[default]
    One,
    /// Up to this many, as many as the call's size gives shares of [`share_bytes`].
    Auto(usize),
    /// This many on every call the choice splits (`SILVIC_CHANNELS=N`).
    Forced(usize),
}

/// The most channels an automatic count opens, whatever the cores: past it a call's shares
/// are small and the ring's neighbours hold many streams for little.
pub(crate) const MAX_AUTO_CHANNELS: usize = 8;

impl Spread {
    /// The most channels a call may run on: the channels a ring opens.
    pub(crate) fn most(self) -> usize {
        match self {
            Spread::One => 1,
            Spread::Auto(n) | Spread::Forced(n) => n,
        }
    }
}

/// What the choice decides for one allreduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The path it takes.
    pub(crate) path: Path,
    /// The channels it runs on ([`channels`]): 1 but for large calls on the ring path.
    pub(crate) channels: usize,
}

/// The choice for an allreduce of `shape` on `network` (the forced path where it [`carries`]
/// the call, else [`chosen_path`]'s; the channels [`channels`] gives it), the same on every
/// rank given the same arguments.
pub(crate) fn choose(shape: Shape, network: Network, forced: Forced) -> Choice {
    let Shape { bytes, elem, world } = shape;
    let path = match forced.path {
        Some(path) if carries(path, bytes, world, network) => path,
        _ => chosen_path(bytes, elem, world, network),
    };
    Choice { path, channels: channels(bytes, path, network, forced.spread) }
}

/// The least a channel of a split call carries: a channel's thread and frames cost about the
/// same whatever it carries, so a share much smaller than this only adds that cost.
pub(crate) const MIN_SHARE_BYTES: usize = 1 << 20;

/// How many hops' worth of bytes a channel's share holds at least: a share that passes in a
/// few hops is mostly latency, which splitting does not shorten.
pub(crate) const SHARE_HOPS: u64 = 8;

/// The least a channel carries on `network`: [`MIN_SHARE_BYTES`], or the bytes one stream
/// moves in [`SHARE_HOPS`] hops at the measured rate (loopback's where it was not measured),
/// whichever is more.
pub(crate) fn share_bytes(network: Network) -> usize {
    let rate = match network.bytes_per_us {
        Network::UNMEASURED_RATE => RATE_BYTES_PER_US,
        rate => rate,
    };
    let hops = u128::from(SHARE_HOPS) * u128::from(network.hop_ns) * u128::from(rate) / 1000;
    usize::try_from(hops).unwrap_or(usize::MAX).max(MIN_SHARE_BYTES)
}

/// The channels an allreduce of `bytes` on `path` runs on, on `network` with `spread`: one
/// unless the path is the ring's (the only plan that runs on a channel's pieces,
/// `ring/layout.rs`) and the call holds two shares or more. A forced count splits every such
/// call of two [`MIN_SHARE_BYTES`] or more, whatever the network, so that what is forced is
/// known; the automatic count gives each channel a share of [`share_bytes`] at least, up to the
/// most it may take. The same on every rank.
pub(crate) fn channels(bytes: usize, path: Path, network: Network, spread: Spread) -> usize {
    if path != Path::Ring {
        return 1;
    }
    match spread {
        Spread::One => 1,
        Spread::Forced(n) if bytes / MIN_SHARE_BYTES >= 2 => n,
        Spread::Forced(_) => 1,
        Spread::Auto(n) => n.min(bytes / share_bytes(network)).max(1),
    }
}

/// The path of an allgather of whole blocks (`allgather_bytes`, and the allreduce's own
/// gathers of raw buffers where it has one): Bruck's rounds where the link has chord streams
/// and hops are long ([`Network::log_depth`]), else the two-way gather.
pub(crate) fn allgather_path(network: Network) -> Path {
    if network.log_depth() { Path::Bruck } else { Path::Gather }
}

/// What a ring knows of its network: measured once when it forms (`probe.rs`), agreed
/// by every rank (the worst rank's figures), so every rank derives the same plans from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Network {
    /// What one hop costs, in nanoseconds: a small frame's way to a neighbour and its wake-up.
    pub(crate) hop_ns: u64,
    /// Whether the link carries the log-depth paths' routes, to `rank ± 2^k` for every
    /// `2^k < world` (chord streams, `topology.rs`): what lets the cut choose them.
    pub(crate) chords: bool,
    /// The rate one rank's bytes leave it, in bytes per microsecond, as the ring path moved
    /// them: measured only where hops are long ([`Network::long_hops`]), where the cut weighs
    /// bytes against hops with it. [`Network::UNMEASURED_RATE`] where it was not measured;
    /// the cut then takes today's loopback figure ([`RATE_BYTES_PER_US`]).
    pub(crate) bytes_per_us: u64,
    /// The rate a rank folds, in bytes per microsecond, timed on the gather path's own fold
    /// (`probe::fold_probe_ns`): measured with the link's rate and [`Network::UNMEASURED_RATE`]
    /// where that was not. The ring's probes fold as they send, so the link's rate is what is
    /// left of their time once their folds at this rate are taken off.
    pub(crate) folds_per_us: u64,
}

impl Network {
    /// A network nothing was measured of: in-memory tests, and links without a clock.
    pub(crate) const UNMEASURED: Network = Network {
        hop_ns: 0,
        chords: false,
        bytes_per_us: Self::UNMEASURED_RATE,
        folds_per_us: Self::UNMEASURED_RATE,
    };

    /// The rate of a network whose rate was not measured (hops below
    /// [`Network::LOG_DEPTH_FROM_HOP_NS`], or nothing measured at all).
    pub(crate) const UNMEASURED_RATE: u64 = 0;

    /// The hop from which the log-depth paths are taken where chords exist, and from which the
    /// ring measures its rate and the cut weighs it. Below it a hop is mostly a rank's wake-up,
    /// which every path pays per frame, and fewer hops saved nothing: on loopback (8 ranks on 2
    /// cores, a hop of 30 to 50 us) Bruck's gather and the index measured slower than the
    /// gather and the ring (docs/paths.md, "The cut").
    pub(crate) const LOG_DEPTH_FROM_HOP_NS: u64 = 100_000;

    /// Whether a hop costs at least [`Network::LOG_DEPTH_FROM_HOP_NS`]: where the ring
    /// measures its rate when it forms, and the cut is the cost model's.
    pub(crate) fn long_hops(self) -> bool {
        self.hop_ns >= Self::LOG_DEPTH_FROM_HOP_NS
    }

    /// Whether calls may take the log-depth paths (Bruck's gather, index-fold-gather): the link
    /// has chord streams and hops are long ([`Network::long_hops`]).
    pub(crate) fn log_depth(self) -> bool {
        self.chords && self.long_hops()
    }
}

/// Buffers of fewer bytes than this always take the gather path: one allgather of whole
/// buffers, folded locally in [`schedule::fold_order`].
pub(crate) const SMALL_BYTES: usize = 4096;

// The cost model that picks the path from 4 KiB up. A call costs its hops times the cost of a
// hop plus the bytes one rank sends over the link rate:
//
//   gather: floor(n/2) hops, (n - 1) × S bytes
//   ring:   n - 1 + floor(n/2) hops, 2(n - 1)/n × S bytes
//
// (the gather, and the ring's allgather of reduced segments, run both ways round the ring at
// once, super::twoway), so the gather wins while (n - 1) × S × (1 - 2/n) / rate < (n - 1) hops,
// that is while S × (n - 2)/n < hop × rate: at worlds 1 and 2 always, and at larger worlds below
// a cut that falls towards hop × rate as n grows (35 KiB at world 4, 23 KiB at 8, 20 KiB at 16
// with the constants below). The constants are loopback figures of a shared 2-core machine
// (docs/paths.md, "The cut", where the two paths forced are measured against each other around
// it); on another network, measure a hop and the per-rank rate with silvic-bench and change them
// here.

/// What one hop costs, in nanoseconds: a wake-up and a small frame's way to the neighbour. A
/// loopback figure: with [`RATE_BYTES_PER_US`] it puts the cut where the two paths, each
/// forced, measured alike on a shared 2-core machine (docs/results/cut.csv): at world 4 where
/// they cross, at worlds 8 and 16 a little above it (the measured crossing falls with the world
/// faster than the model's cut).
pub(crate) const HOP_NS: u64 = 12_000;

/// The rate at which one rank's bytes leave it, in bytes per microsecond (1500 is 1.5 GB/s, a
/// loopback figure, the ring's busbw there).
pub(crate) const RATE_BYTES_PER_US: u64 = 1_500;

/// The most memory the gather path may hold for the gathered buffers (`world × bytes`) above
/// [`SMALL_BYTES`]: past it the ring is taken whatever the model says, so the gather's extra
/// memory is at most `max(GATHER_MAX_BYTES, world × 4 KiB)`.
pub(crate) const GATHER_MAX_BYTES: usize = 1 << 20;

/// Whether an allreduce of `bytes` in a world of `world` takes the gather path (else the ring)
/// on loopback: [`uses_gather_at`] loopback's hop, [`HOP_NS`]. The choice itself cuts at
/// [`short_hop_ns`]; this is the loopback cut the tests and [`gather_limit`] name.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn uses_gather(bytes: usize, world: usize) -> bool {
    uses_gather_at(bytes, world, HOP_NS)
}

/// Whether an allreduce of `bytes` in a world of `world` takes the gather path (else the ring)
/// where a hop costs `hop_ns`, at loopback's rate ([`RATE_BYTES_PER_US`]).
///
/// Below [`SMALL_BYTES`] always; above it, when the gathered buffers fit in
/// [`GATHER_MAX_BYTES`] and the model above says the gather is cheaper. Either path gives the
/// same bits, so this only decides the speed (and the memory).
pub(crate) fn uses_gather_at(bytes: usize, world: usize, hop_ns: u64) -> bool {
    if bytes < SMALL_BYTES {
        return true;
    }
    if world.saturating_mul(bytes) > GATHER_MAX_BYTES {
        return false;
    }
    if world <= 2 {
        // The same bytes in no more hops: nothing for the ring to win.
        return true;
    }
    // Compared in integers, scaled by n × RATE (bytes per us) × 1000 (ns per us):
    // gather < ring  <=>  (n - 2) × S × 1000 < n × hop × RATE.
    let (n, s) = (world as u128, bytes as u128);
    (n - 2) * s * 1000 < n * u128::from(hop_ns) * u128::from(RATE_BYTES_PER_US)
}

/// The hop the short-hop cut ([`uses_gather_at`]) is made at on `network`: the measured hop
/// where it is shorter than loopback's [`HOP_NS`], else that. A hop shorter than loopback's (a
/// fast network, a simulated one, a quiet machine) makes the gather's extra bytes dear sooner
/// than the constants say; and the hop is the steady figure (the fastest of the hop probes),
/// where the measured rate swings many times over with a shared machine's load, so the cut
/// keeps loopback's rate. A longer short hop is mostly the wake-ups every path pays per frame,
/// as on the loaded loopback the constants were fitted on (docs/paths.md, "The cut"). A hop of
/// 0 was not measured (in-memory links): loopback's.
pub(crate) fn short_hop_ns(network: Network) -> u64 {
    match network.hop_ns {
        0 => HOP_NS,
        hop => hop.min(HOP_NS),
    }
}

/// The largest buffer, in bytes, that takes the gather path in a world of `world`: every
/// smaller size does too, every larger one takes the ring.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn gather_limit(world: usize) -> usize {
    // `uses_gather` is monotone in the size, so a binary search over [SMALL_BYTES, cap] finds
    // the edge; past `cap` the memory bound alone refuses it.
    let cap = GATHER_MAX_BYTES.max(SMALL_BYTES);
    let (mut lo, mut hi) = (SMALL_BYTES - 1, cap + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if uses_gather(mid, world) { lo = mid } else { hi = mid }
    }
    lo
}

/// Slices of a segment that go round the ring side by side (the ring plan's window) on
/// `network`: the frames of a window's slices go step by step, so a step pays a hop once for
/// all of them rather than once per slice. One slice, plus as many as leave a rank at
/// [`RATE_BYTES_PER_US`] while a hop passes: one on loopback, where a slice is best forwarded
/// while its fold is still in cache, more where hops are long (docs/paths.md). Every rank
/// must use the same window (it orders the frames on the wire): every rank has the same
/// `network`.
pub(crate) fn window(network: Network) -> usize {
    let in_flight = u128::from(network.hop_ns) * u128::from(RATE_BYTES_PER_US) / 1000;
    let extra = in_flight / schedule::SLICE_BYTES as u128;
    1 + usize::try_from(extra).unwrap_or(usize::MAX).min(schedule::MAX_WINDOW - 1)
}

/// The path an allreduce of `bytes` (elements of `elem` bytes) takes in a world of `world` on
/// `network`, the same on every rank (every rank has the same `network`).
///
/// - Hops below [`Network::LOG_DEPTH_FROM_HOP_NS`], or long hops of a network whose rate was
///   not measured and that has no chords: the gather or the ring as [`uses_gather_at`] cuts
///   at [`short_hop_ns`] (loopback's constants, or a measured hop shorter than loopback's).
/// - Long hops ([`Network::long_hops`]): the cheapest path in the cost model
///   ([`cheapest`]) at the hop and the rate the ranks measured ([`model_of`]), the
///   folds charged too (the gather's local fold of `n - 1` buffers among them); of the
///   gather and the ring without chords, of every path with them
///   ([`Network::log_depth`]). Index-fold-gather is a candidate only while its store takes
///   the buffer in one chunk: each further chunk pays every round's hops again, and the ring
///   keeps large buffers. Within that, the measured rate decides: where bytes are dear (a bed
///   of many ranks on few cores) the index's extra bytes keep the ring.
pub(crate) fn chosen_path(bytes: usize, elem: usize, world: usize, network: Network) -> Path {
    use Path::{Bruck, Gather, Ring};
    if !by_model(network) {
        return if uses_gather_at(bytes, world, short_hop_ns(network)) { Gather } else { Ring };
    }
    let candidates: &[Path] = if !network.chords {
        &[Ring, Gather]
    } else {
        let one_chunk = chunks(bytes / elem.max(1), world, elem, STORE_MAX_BYTES) == 1;
        if one_chunk { &Path::ALL } else { &[Ring, Gather, Bruck] }
    };
    cheapest(candidates, bytes, elem, world, model_of(network)).unwrap_or(Ring)
}

/// Whether [`chosen_path`] weighs the paths in the cost model on `network` (long hops, with a
/// measured rate or chord streams), rather than cutting at [`uses_gather_at`]'s loopback
/// constants ([`short_hop_ns`]).
fn by_model(network: Network) -> bool {
    let rated = network.bytes_per_us != Network::UNMEASURED_RATE;
    network.long_hops() && (rated || network.chords)
}

/// The cost model's network for what a ring measured: its hop, and where its rates were
/// measured, the rate a rank sends at and the rate it folds at (`probe::rate_from`,
/// `probe::fold_rate_from`); else loopback's rate ([`RATE_BYTES_PER_US`]) and folds
/// free, as before the rates were measured.
pub(crate) fn model_of(network: Network) -> Model {
    match network.bytes_per_us {
        Network::UNMEASURED_RATE => Model { hop_ns: network.hop_ns, ..Model::LOOPBACK },
        rate => Model {
            hop_ns: network.hop_ns,
            bytes_per_us: rate,
            folds_per_us: Some(network.folds_per_us.max(1)),
        },
    }
}

/// The cut on `network` for a world of `world`, for the log: what the rule cut with (short
/// hops: [`uses_gather_at`]'s loopback constants, or the measured hop where it is shorter
/// ([`short_hop_ns`]), whatever rate was measured; else the model's rate, [`model_of`]: the
/// measured one, or loopback's), then at sizes from 8 B to 64 MiB (f64 elements), the path
/// [`chosen_path`] takes and the time that model gives it.
pub(crate) fn describe_cuts(world: usize, network: Network) -> String {
    let (model, rate) = if !by_model(network) {
        let hop_ns = short_hop_ns(network);
        let (loopback, rate) = (HOP_NS / 1000, RATE_BYTES_PER_US);
        let rate = if hop_ns < HOP_NS {
            let hop_us = hop_ns as f64 / 1000.0;
            let loopback = format!("loopback's {loopback} us at most");
            format!("short hops, the measured {hop_us:.1} us ({loopback}) and {rate} B/us")
        } else {
            format!("short hops, loopback's {loopback} us hops and {rate} B/us")
        };
        (Model { hop_ns, ..Model::LOOPBACK }, rate)
    } else {
        let model = model_of(network);
        let rate = match network.bytes_per_us {
            Network::UNMEASURED_RATE => {
                format!("loopback's {} B/us, folds free", model.bytes_per_us)
            }
            measured => format!("measured {measured} B/us, folds {} B/us", network.folds_per_us),
        };
        (model, rate)
    };
    let sizes = [8, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20];
    let cut = sizes.map(|bytes| {
        let path = chosen_path(bytes, 8, world, network);
        let us = time_ns(path, bytes, 8, world, model) as f64 / 1000.0;
        format!("{bytes} B {path:?} {us:.0} us")
    });
    format!("at {rate}: {}", cut.join(", "))
}

/// Whether `path` can carry an allreduce of `bytes` in a world of `world` on `network`: the
/// gathering paths within the gather's memory bound ([`fits`]), the log-depth paths on a
/// link with chord streams, the ring always.
pub(crate) fn carries(path: Path, bytes: usize, world: usize, network: Network) -> bool {
    let chords = !matches!(path, Path::Bruck | Path::Index) || network.chords;
    chords && fits(path, bytes, world)
}

impl Path {
    /// Every path, in the order ties are broken: to the paths that hold less memory, and of the
    /// two gathers to today's.
    pub(crate) const ALL: [Path; 4] = [Path::Ring, Path::Index, Path::Gather, Path::Bruck];
    /// The paths a ring without chord streams carries, ties to the ring as [`uses_gather_at`]
    /// breaks them.
    #[cfg(test)]
    pub(crate) const RING_ONLY: [Path; 2] = [Path::Ring, Path::Gather];
}

/// The cost model's network: a hop's latency, the rate one rank's bytes leave it, and the rate a
/// rank folds (`None`: folds taken as free, as [`uses_gather_at`] takes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) hop_ns: u64,
    pub(crate) bytes_per_us: u64,
    pub(crate) folds_per_us: Option<u64>,
}

impl Model {
    /// The constants today's cut is made with ([`HOP_NS`],
    /// [`RATE_BYTES_PER_US`]), folds free.
    pub(crate) const LOOPBACK: Model =
        Model { hop_ns: HOP_NS, bytes_per_us: RATE_BYTES_PER_US, folds_per_us: None };
}

/// What one call costs on a path, independent of the network: hops, `n ×` the bytes one rank
/// sends and folds (so every count is an integer), and the frames it queues (see the module
/// doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub(crate) hops: u64,
    pub(crate) sent_n: u128,
    pub(crate) folded_n: u128,
    pub(crate) queued: u64,
}

/// What a frame queued behind another on one way costs beyond its bytes, in bytes at the rate
/// one rank's bytes leave it. The fixed work of a frame (its write, the receiver's wake-up and
/// read) is done on the cores that move the bytes, so where those cores are shared the bytes
/// are slow too, and the rate scales it: on a bed of many ranks on few cores a queued frame
/// measured about twice this at the probed rate, and without it the model took the index where
/// Bruck's gather or the ring was faster (docs/paths.md, "The cut"). It is half that because a
/// link slow by its wire, not its cores, measures the same rate with frames that cost a few
/// us: there a queued frame is priced 33 us at 1 Gbit/s (Bruck's gather is still taken at
/// world 16 and hops of 100 us, not at world 8, where it saves one hop for four frames), and
/// 3.3 us at 10 Gbit/s. No probe measures a frame's cost apart from its bytes and its hop.
pub(crate) const FRAME_COST_BYTES: u64 = 4 << 10;

/// Set bits in `0..world`: the slots the index sends, over all its rounds.
fn slots_sent(world: usize) -> u128 {
    (0..world).map(|i| u128::from(i.count_ones())).sum()
}

/// The traffic of an allreduce of `bytes` (elements of `elem` bytes) in a world of `world` on
/// `path` (see the module doc's table).
pub(crate) fn traffic(path: Path, bytes: usize, elem: usize, world: usize) -> Traffic {
    let (n, s) = (world as u128, bytes as u128);
    let below = n.saturating_sub(1);
    let log = rounds(world) as u64;
    // Bruck's gather (and the index's allgather) sends `n - 1` blocks in `L` rounds.
    let gathered = (world as u64).saturating_sub(1).saturating_sub(log);
    match path {
        Path::Gather => Traffic {
            hops: world as u64 / 2,
            sent_n: n * below * s,
            folded_n: n * below * s,
            queued: 0,
        },
        Path::Ring => Traffic {
            hops: (world as u64).saturating_sub(1) + world as u64 / 2,
            sent_n: 2 * below * s,
            folded_n: below * s,
            queued: 0,
        },
        Path::Bruck => {
            Traffic { hops: log, sent_n: n * below * s, folded_n: n * below * s, queued: gathered }
        }
        Path::Index => {
            let count = chunks(bytes / elem.max(1), world, elem.max(1), STORE_MAX_BYTES) as u64;
            let slots = u64::try_from(slots_sent(world)).unwrap_or(u64::MAX);
            Traffic {
                hops: log * (count + 1),
                sent_n: (slots_sent(world) + below) * s,
                folded_n: below * s,
                queued: count.saturating_mul(slots.saturating_sub(log)).saturating_add(gathered),
            }
        }
    }
}

/// Whether `path` gathers every rank's whole buffer and then folds them locally: it holds
/// `n × S`, and its folds come after its last frame (the simulator charges them so).
pub(crate) fn gathers(path: Path) -> bool {
    match path {
        Path::Gather | Path::Bruck => true,
        Path::Ring | Path::Index => false,
    }
}

/// Whether `path` may carry `bytes` in a world of `world`: the gathering paths only within the
/// gather path's memory bound.
pub(crate) fn fits(path: Path, bytes: usize, world: usize) -> bool {
    !gathers(path) || bytes < SMALL_BYTES || world.saturating_mul(bytes) <= GATHER_MAX_BYTES
}

/// The time of `traffic` in a world of `world` on `net`, scaled by `world × bytes_per_us ×
/// folds_per_us` (the last taken as 1 when folds are free), so that it is exact: its hops, its
/// bytes sent with [`FRAME_COST_BYTES`] for each frame queued, and its folds. Saturates rather
/// than overflow (a hop of centuries agreed from a peer's figure): every path then costs the
/// same, and the first candidate is taken.
pub(crate) fn scaled_time(traffic: Traffic, world: usize, net: Model) -> u128 {
    let (n, rate) = (world.max(1) as u128, u128::from(net.bytes_per_us.max(1)));
    let folds = net.folds_per_us.map_or(1, |f| u128::from(f.max(1)));
    let scale = [n, rate, folds].into_iter().fold(1u128, u128::saturating_mul);
    let hops = (u128::from(traffic.hops) * u128::from(net.hop_ns)).saturating_mul(scale);
    let frames = n * u128::from(traffic.queued) * u128::from(FRAME_COST_BYTES);
    let sent = traffic.sent_n.saturating_add(frames).saturating_mul(1000 * folds);
    let folded = net.folds_per_us.map_or(0, |_| traffic.folded_n.saturating_mul(1000 * rate));
    hops.saturating_add(sent).saturating_add(folded)
}

/// The time of a call in nanoseconds (rounded down), for logs and tables.
pub(crate) fn time_ns(path: Path, bytes: usize, elem: usize, world: usize, net: Model) -> u64 {
    let (n, rate) = (world.max(1) as u128, u128::from(net.bytes_per_us.max(1)));
    let folds = net.folds_per_us.map_or(1, |f| u128::from(f.max(1)));
    let scaled = scaled_time(traffic(path, bytes, elem, world), world, net);
    u64::try_from(scaled / (n * rate).saturating_mul(folds)).unwrap_or(u64::MAX)
}

/// The cheapest of `candidates` that fits, for an allreduce of `bytes` (elements of `elem`
/// bytes) in a world of `world` on `net`; the earliest of equals. `None` if none fits.
pub(crate) fn cheapest(
    candidates: &[Path],
    bytes: usize,
    elem: usize,
    world: usize,
    net: Model,
) -> Option<Path> {
    let fitting = candidates.iter().copied().filter(|p| fits(*p, bytes, world));
    let cost = |p: Path| scaled_time(traffic(p, bytes, elem, world), world, net);
    fitting.fold(None, |best: Option<Path>, p| match best {
        Some(b) if cost(b) <= cost(p) => Some(b),
        _ => Some(p),
    })
}

#[cfg(test)]
#[path = "choice_tests.rs"]
mod tests;
