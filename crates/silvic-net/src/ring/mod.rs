//! The ring algorithms: which bytes move in which frame, and how they are folded.
//!
//! A new algorithm is one new file: a [`seam::FramePlan`] and the call that builds it. The
//! modules, by concept:
//!
//! - [`seam`]: what a link imports (the plan and link traits, per-way [`seam::Moved`], the
//!   rule that keeps gates from waiting in a circle, and how a driver runs a plan);
//! - [`element`]: the element codec, the numbers as the bytes payloads carry;
//! - [`gather`]: the gather plan (the two-way allgather), `allgather_bytes` and the allreduce's
//!   gather path;
//! - [`ring_path`]: the ring plan, the allreduce's reduce-scatter and gather of slices;
//! - [`records`]: the reduce-scatter of the caller's blocks with the caller's fold over
//!   records, and the record allreduce made of it and a gather;
//! - [`varlen`]: the allgather of blocks of any length and the broadcast, gathers that learn
//!   the lengths first;
//! - [`schedule`] and [`twoway`]: the pure arithmetic both plans are built on;
//! - [`bruck`] and [`index`]: the log-depth plans (Bruck's allgather, and index-fold-gather),
//!   whose rounds go to `rank ± 2^k`: chosen where the link has chord streams;
//!   [`allreduce_on`] runs any path, and [`cost`] is the model [`chosen_path`] chooses with;
//! - `mem` (tests only): one deterministic in-memory driver that runs real calls on every rank
//!   (the simulator's virtual-time driver, `simulate/`, runs the same plans without bytes);
//!   `lockstep` (tests only) moves every rank's plan in one thread over streams named by rank
//!   pairs, and `plan_checks` (tests only) checks plans of any number of ways without running
//!   them: the stream-sharing rule, distinct headers, nothing overwritten in flight.
//!
//! Invariants this module keeps, whatever carries the bytes:
//!
//! - **Plans of frames.** A collective is a fixed plan: per way round the ring, the frames a
//!   rank sends to one neighbour and receives from the other, in order, with gates that say
//!   when each may move: a frame out once the frames it forwards are in, a frame in once the
//!   frames that sent what it overwrites are out. Gates keep the seam's rule (a gate looks only
//!   at earlier frames of its way and at earlier ways), so a link that moves whatever its gates
//!   let through never deadlocks. Every frame names the op, the sequence number, the buffer
//!   length, its direction and its block, and is checked before its payload is used.
//! - **Fold order.** Element `i` is folded over ranks in [`schedule::fold_order`] of its segment,
//!   `j, j + 1, …, j - 1` (mod world), left to right with silvic-core's combiners. That depends
//!   on `(i, len, world)` alone, and both paths use it, so results are bitwise identical on every
//!   rank, on every run, and on either path, wherever the cut falls.
//! - **One cut, the same on every rank.** [`chosen_path`] picks the path from the buffer size,
//!   the world size and the network every rank agreed on when the ring formed, so every rank
//!   picks the same. Where hops are short (loopback), [`schedule::uses_gather`]'s cut of
//!   loopback constants: the gather below 4 KiB, and above it while a model of hops against
//!   bytes says it is cheaper and the gathered buffers fit in [`schedule::GATHER_MAX_BYTES`].
//!   Where hops are long ([`Network::long_hops`]), the cost model ([`cost`]) at the measured
//!   hop and rate, among the gather and the ring, and the log-depth paths where chords exist.
//! - **Traffic and memory.** The ring path is a reduce-scatter round the ring, then the reduced
//!   segments gathered both ways round it at once ([`twoway`]): `n - 1 + floor(n/2)` hops,
//!   `2(n-1)/n` of the buffer leaving each rank, and the only extra memory a fixed-size fold
//!   scratch. Each segment is cut into [`schedule::slices`] of the same count, and a rank
//!   forwards a slice as soon as it has folded it, while the next slice sets off behind it. The
//!   gather path is one two-way allgather of whole buffers (`floor(n/2)` hops, each block
//!   forwarded as soon as it is in); it holds `n × bytes`, at most `max(GATHER_MAX_BYTES, n × 4
//!   KiB)`, kept in [`Scratch`] so that a steady state allocates nothing per call.
//!
//! Not here: sockets, clocks and failure handling. [`Link`] is the seam: the TCP ring plugs in
//! over poll(2), and the tests plug in the in-memory driver.

pub(crate) mod bruck;
#[cfg(test)]
pub(crate) mod circular;
pub(crate) mod cost;
pub(crate) mod element;
pub(crate) mod gather;
pub(crate) mod index;
#[cfg(test)]
pub(crate) mod lockstep;
#[cfg(test)]
pub(crate) mod mem;
#[cfg(test)]
pub(crate) mod oracle;
#[cfg(test)]
pub(crate) mod plan_checks;
pub(crate) mod records;
pub(crate) mod ring_path;
pub(crate) mod schedule;
pub(crate) mod seam;
pub(crate) mod twoway;
pub(crate) mod varlen;

use silvic_core::{CollectiveError, Numbers, Reduction, fold};

pub(crate) use element::Element;
pub(crate) use gather::{allgather, fold_gathered};
use seam::Network;
pub(crate) use seam::{Call, Link};

use crate::frame::Dir;
use seam::Route;

/// The two ways of both plans: way [`RIGHTWARD`] to the right neighbour, then way [`LEFTWARD`].
/// A gate of the leftward way may look at the rightward way, never the other way round (the
/// seam's rule).
const TWO_WAYS: [Route; 2] = [Route::RIGHTWARD, Route::LEFTWARD];
const RIGHTWARD: usize = 0;
const LEFTWARD: usize = 1;

/// The direction a frame of `way` (of [`TWO_WAYS`]) names in its header.
fn wire_dir(way: usize) -> Dir {
    match way {
        RIGHTWARD => Dir::Right,
        _ => Dir::Left,
    }
}

/// Reusable memory of a ring, kept between calls so steady-state collectives do not allocate.
///
/// It grows to the largest call seen and stays there: `fold` is the ring path's fold scratch,
/// and `gathered` holds the gather path's `world × bytes`, at most
/// `max(GATHER_MAX_BYTES, world × 4 KiB)` ([`schedule::GATHER_MAX_BYTES`]).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    fold: Vec<u8>,
    gathered: Vec<u8>,
}

/// Allreduces of this many bytes or more never take index-fold-gather: through 500 us hops
/// (the relay bed) it was faster than the ring at 32 and 256 KiB but slower at 1 MiB, where
/// its frame per slot costs more than the hops it saves (docs/log-depth-paths.md).
pub(crate) const INDEX_BELOW_BYTES: usize = 1 << 20;

/// The path an allreduce of `bytes` (elements of `elem` bytes) takes in a world of `world` on
/// `network`, the same on every rank (every rank has the same `network`).
///
/// - Hops below [`Network::LOG_DEPTH_FROM_HOP_NS`], or long hops of a network whose rate was
///   not measured and that has no chords: the gather or the ring as [`schedule::uses_gather`]
///   cuts (loopback's constants).
/// - Long hops ([`Network::long_hops`]): the cheapest path in the cost model
///   ([`cost::cheapest`]) at the hop and the rate the ranks measured ([`model_of`]), the
///   folds charged too (the gather's local fold of `n - 1` buffers among them); of the
///   gather and the ring without chords, of every path with them
///   ([`Network::log_depth`]). Index-fold-gather is a candidate only below
///   [`INDEX_BELOW_BYTES`] and while its store takes the buffer in one chunk: it sends a frame
///   per slot, a cost the model does not count, and the ring keeps large buffers.
pub(crate) fn chosen_path(bytes: usize, elem: usize, world: usize, network: Network) -> cost::Path {
    use cost::Path::{Bruck, Gather, Ring};
    let rated = network.bytes_per_us != Network::UNMEASURED_RATE;
    if !network.long_hops() || !(rated || network.chords) {
        return if schedule::uses_gather(bytes, world) { Gather } else { Ring };
    }
    let candidates: &[cost::Path] = if !network.chords {
        &[Ring, Gather]
    } else {
        let one_chunk =
            index::chunks(bytes / elem.max(1), world, elem, index::STORE_MAX_BYTES) == 1;
        if one_chunk && bytes < INDEX_BELOW_BYTES {
            &cost::Path::ALL
        } else {
            &[Ring, Gather, Bruck]
        }
    };
    cost::cheapest(candidates, bytes, elem, world, model_of(network)).unwrap_or(Ring)
}

/// The cost model's network for what a ring measured: its hop, and where its rates were
/// measured, the rate a rank sends at and the rate it folds at (`probe::rate_from`,
/// `probe::fold_rate_from`); else loopback's rate ([`schedule::RATE_BYTES_PER_US`]) and folds
/// free, as before the rates were measured.
pub(crate) fn model_of(network: Network) -> cost::Network {
    match network.bytes_per_us {
        Network::UNMEASURED_RATE => {
            cost::Network { hop_ns: network.hop_ns, ..cost::Network::LOOPBACK }
        }
        rate => cost::Network {
            hop_ns: network.hop_ns,
            bytes_per_us: rate,
            folds_per_us: Some(network.folds_per_us.max(1)),
        },
    }
}

/// The cut on `network` for a world of `world`, for the log: the model's rate ([`model_of`]:
/// the measured one, or loopback's), then at sizes from 8 B to 64 MiB (f64 elements), the path
/// [`chosen_path`] takes and the time the cost model gives it on that model.
pub(crate) fn describe_cuts(world: usize, network: Network) -> String {
    let model = model_of(network);
    let rate = match network.bytes_per_us {
        Network::UNMEASURED_RATE => format!("loopback's {} B/us, folds free", model.bytes_per_us),
        measured => format!("measured {measured} B/us, folds {} B/us", network.folds_per_us),
    };
    let sizes = [8, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20];
    let cut = sizes.map(|bytes| {
        let path = chosen_path(bytes, 8, world, network);
        let us = cost::time_ns(path, bytes, 8, world, model) as f64 / 1000.0;
        format!("{bytes} B {path:?} {us:.0} us")
    });
    format!("at {rate}: {}", cut.join(", "))
}

/// Whether `path` can carry an allreduce of `bytes` in a world of `world` on `network`: the
/// gathering paths within the gather's memory bound ([`cost::fits`]), the log-depth paths on a
/// link with chord streams, the ring always.
pub(crate) fn carries(path: cost::Path, bytes: usize, world: usize, network: Network) -> bool {
    let chords = !matches!(path, cost::Path::Bruck | cost::Path::Index) || network.chords;
    chords && cost::fits(path, bytes, world)
}

/// The path an allreduce takes: `forced` where that path [`carries`] the call, else the one
/// [`chosen_path`] picks. The same on every rank, given the same arguments.
pub(crate) fn taken_path(
    forced: Option<cost::Path>,
    bytes: usize,
    elem: usize,
    world: usize,
    network: Network,
) -> cost::Path {
    match forced {
        Some(path) if carries(path, bytes, world, network) => path,
        _ => chosen_path(bytes, elem, world, network),
    }
}

/// Replaces `buf` with its reduction over the ring, `combine` folding in fold order, on the
/// path [`taken_path`] picks (the link's forced path where it carries the call).
pub(crate) fn allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let (bytes, network) = (size_of_val(buf), link.network());
    let path = taken_path(link.forced(), bytes, size_of::<T>(), call.world, network);
    allreduce_on(path, link, call, buf, combine, scratch)
}

/// [`allreduce`] on the path `path`, whatever the cut says (the simulator forces paths): every
/// path gives the same bits. The log-depth paths ([`bruck`], [`index`]) route frames to
/// `rank ± 2^k`, which only a link with chord streams carries.
pub(crate) fn allreduce_on<T: Element, C: Fn(T, T) -> T + Copy>(
    path: cost::Path,
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    match path {
        cost::Path::Gather => gather::gather_allreduce(link, call, buf, combine, scratch),
        cost::Path::Ring => ring_path::ring_allreduce(link, call, buf, combine, scratch),
        cost::Path::Bruck => bruck::bruck_allreduce(link, call, buf, combine, scratch),
        cost::Path::Index => index::index_allreduce(link, call, buf, combine, scratch),
    }
}

/// [`allreduce`] of a typed buffer with `reduction`'s combiner for its element type.
pub(crate) fn allreduce_numbers(
    link: &mut dyn Link,
    call: Call,
    buf: Numbers<'_>,
    reduction: Reduction,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    use Reduction::{Max, Min, Sum};
    let (l, c, s) = (link, call, scratch);
    match (buf, reduction) {
        (Numbers::F32(b), Sum) => allreduce(l, c, b, fold::sum_f32, s),
        (Numbers::F32(b), Min) => allreduce(l, c, b, fold::min_f32, s),
        (Numbers::F32(b), Max) => allreduce(l, c, b, fold::max_f32, s),
        (Numbers::F64(b), Sum) => allreduce(l, c, b, fold::sum_f64, s),
        (Numbers::F64(b), Min) => allreduce(l, c, b, fold::min_f64, s),
        (Numbers::F64(b), Max) => allreduce(l, c, b, fold::max_f64, s),
        (Numbers::I32(b), Sum) => allreduce(l, c, b, fold::sum_i32, s),
        (Numbers::I32(b), Min) => allreduce(l, c, b, fold::min_int, s),
        (Numbers::I32(b), Max) => allreduce(l, c, b, fold::max_int, s),
        (Numbers::I64(b), Sum) => allreduce(l, c, b, fold::sum_i64, s),
        (Numbers::I64(b), Min) => allreduce(l, c, b, fold::min_int, s),
        (Numbers::I64(b), Max) => allreduce(l, c, b, fold::max_int, s),
        (Numbers::U64(b), Sum) => allreduce(l, c, b, fold::sum_u64, s),
        (Numbers::U64(b), Min) => allreduce(l, c, b, fold::min_int, s),
        (Numbers::U64(b), Max) => allreduce(l, c, b, fold::max_int, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mem::{Driver, on_ring};
    use oracle::{bits, input, reference};
    use silvic_core::Op;

    #[test]
    fn with_chords_and_long_hops_the_cut_takes_every_path_and_else_todays() {
        use cost::Path::{Bruck, Gather, Index, Ring};
        let sizes: Vec<usize> = (3..=26).map(|b| 1 << b).collect();
        for world in [8, 16, 64] {
            for hop_us in [10, 50, 100, 500] {
                let hop_ns = hop_us * 1000;
                let with = Network { hop_ns, chords: true, ..Network::UNMEASURED };
                let taken: Vec<_> = sizes.iter().map(|&s| chosen_path(s, 8, world, with)).collect();
                assert_eq!(*taken.last().unwrap(), Ring, "world {world} hop {hop_us} us");
                if hop_ns < Network::LOG_DEPTH_FROM_HOP_NS {
                    // Short hops: today's cut, chords or not.
                    assert!(taken.iter().all(|p| matches!(p, Gather | Ring)), "{taken:?}");
                } else {
                    // The fewest hops for the smallest buffers, the index between.
                    assert_eq!(taken[0], Bruck, "world {world} hop {hop_us} us: {taken:?}");
                    assert!(taken.contains(&Index), "world {world} hop {hop_us} us: {taken:?}");
                }
                for (&bytes, path) in sizes.iter().zip(&taken) {
                    assert!(
                        cost::fits(*path, bytes, world),
                        "{path:?} at {bytes} B, world {world}"
                    );
                    let without = chosen_path(bytes, 8, world, Network { chords: false, ..with });
                    let today = if schedule::uses_gather(bytes, world) { Gather } else { Ring };
                    assert_eq!(without, today);
                }
            }
        }
    }

    #[test]
    fn the_logged_cut_names_the_rate_it_was_made_at() {
        let loopback = describe_cuts(4, Network { hop_ns: 30_000, ..Network::UNMEASURED });
        assert!(
            loopback.starts_with("at loopback's 1500 B/us, folds free: 8 B Gather"),
            "{loopback}"
        );
        let bed = Network { hop_ns: 200_000, chords: false, bytes_per_us: 300, folds_per_us: 300 };
        let measured = describe_cuts(4, bed);
        let start = "at measured 300 B/us, folds 300 B/us: 8 B Gather";
        assert!(measured.starts_with(start), "{measured}");
        assert!(measured.contains("32768 B Gather") && measured.contains("262144 B Ring"));
    }

    #[test]
    fn below_long_hops_the_cut_is_todays_whatever_the_rate() {
        use cost::Path::{Gather, Ring};
        let rates = [Network::UNMEASURED_RATE, 1, 300, 1500, 1 << 20, u64::MAX];
        for world in (1..=17).chain([32, 64, 1024]) {
            for hop_ns in [0, 10_000, 50_000, Network::LOG_DEPTH_FROM_HOP_NS - 1] {
                for (chords, bytes_per_us) in
                    [false, true].into_iter().flat_map(|c| rates.map(|r| (c, r)))
                {
                    let network = Network { hop_ns, chords, bytes_per_us, folds_per_us: 1 };
                    for bytes in (0..=26).map(|b| 1 << b).chain([4095, 4097]) {
                        let today = if schedule::uses_gather(bytes, world) { Gather } else { Ring };
                        let cut = chosen_path(bytes, 8, world, network);
                        assert_eq!(cut, today, "world {world} {bytes} B {network:?}");
                    }
                }
            }
        }
    }

    /// The relay bed's world of 4 (no chords): hops of 200 us and 300 B/us make the gather
    /// cheaper at 32 KiB (three hops fewer, 600 us, for 120 KiB more sent and folded, 410 us)
    /// and the ring at 256 KiB, where the hop alone, at loopback's rate with folds free, would
    /// have kept the gather.
    #[test]
    fn at_long_hops_the_measured_rate_cuts_between_the_gather_and_the_ring() {
        use cost::Path::{Gather, Ring};
        let bed = Network { hop_ns: 200_000, chords: false, bytes_per_us: 300, folds_per_us: 300 };
        assert_eq!(chosen_path(32 << 10, 8, 4, bed), Gather);
        assert_eq!(chosen_path(256 << 10, 8, 4, bed), Ring);
        let hop_alone = cost::Network { hop_ns: bed.hop_ns, ..cost::Network::LOOPBACK };
        assert_eq!(cost::cheapest(&[Ring, Gather], 256 << 10, 8, 4, hop_alone), Some(Gather));
        // Unmeasured, a network without chords keeps today's cut: the ring at 32 KiB.
        let unrated = Network { bytes_per_us: Network::UNMEASURED_RATE, ..bed };
        assert_eq!(chosen_path(32 << 10, 8, 4, unrated), Ring);
        assert!(!schedule::uses_gather(32 << 10, 4));
        // Every world without chords, and the chordless ends of the model: tiny buffers take
        // the gather's fewer hops, large ones the ring, and the gather stays in its memory.
        for world in 2..=7 {
            let net = Network { bytes_per_us: 300, folds_per_us: 300, ..Network::UNMEASURED };
            let net = Network { hop_ns: 200_000, ..net };
            assert_eq!(chosen_path(8, 8, world, net), Gather, "world {world}");
            assert_eq!(chosen_path(64 << 20, 8, world, net), Ring, "world {world}");
            let free = Network { bytes_per_us: 1 << 20, ..net };
            let past = schedule::GATHER_MAX_BYTES / world + 8;
            assert_eq!(chosen_path(past, 8, world, free), Ring, "world {world}");
        }
    }

    /// With chords (world 16, 200 us hops, 256 KiB), the index's 8 hops against the ring's 23
    /// save 3 ms, and it sends 47/16 of the buffer against the ring's 30/16: the index while
    /// those 17/16 × 256 KiB take less than 3 ms (above about 93 B/us), the ring below.
    #[test]
    fn with_chords_the_rate_moves_the_cut_between_the_index_and_the_ring() {
        use cost::Path::{Index, Ring};
        let at = |bytes_per_us| {
            let folds_per_us = bytes_per_us;
            let net = Network { hop_ns: 200_000, chords: true, bytes_per_us, folds_per_us };
            chosen_path(256 << 10, 8, 16, net)
        };
        assert_eq!(at(1500), Index);
        assert_eq!(at(100), Index);
        assert_eq!(at(90), Ring);
        assert_eq!(at(50), Ring);
        assert_eq!(at(Network::UNMEASURED_RATE), Index, "loopback's rate, as before");
    }

    /// The relay bed's world of 8 at 100 us (hops measured at 217 us): at 32 KiB Bruck's gather
    /// takes 3 hops and sends and folds 7 buffers, the index 6 hops for 19/8 of one sent and 7/8
    /// folded. Folds charged at the link's rate (508 B/us) made the index 3% cheaper, where
    /// it measured 1.4x slower; at the rate a core folds, Bruck's folds cost little and it is
    /// taken, while a slow enough folder still takes the index.
    #[test]
    fn folds_at_a_cores_rate_keep_brucks_gather_where_its_hops_are_fewer() {
        use cost::Path::{Bruck, Index};
        let bed = Network { hop_ns: 217_000, chords: true, bytes_per_us: 760, folds_per_us: 8000 };
        assert_eq!(chosen_path(32 << 10, 8, 8, bed), Bruck);
        let folds_as_slow_as_sends = Network { bytes_per_us: 508, folds_per_us: 508, ..bed };
        assert_eq!(chosen_path(32 << 10, 8, 8, folds_as_slow_as_sends), Index);
        // Larger buffers still take the index: its bytes, not its hops, are what it saves.
        assert_eq!(chosen_path(256 << 10, 8, 8, bed), Index);
    }

    /// Runs `world` ranks over `inputs` with `combine`, each rank both paths in turn, then the
    /// dispatcher (which must take `expect_gather`'s path); returns each rank's three results.
    fn three_ways(
        inputs: &[Vec<f64>],
        combine: fn(f64, f64) -> f64,
        expect_gather: Option<bool>,
    ) -> Vec<[Vec<u64>; 3]> {
        let world = inputs.len();
        on_ring(Driver::new(world), |r, link| {
            let mut scratch = Scratch::default();
            let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
            let mut small = inputs[r].clone();
            gather::gather_allreduce(link, call(0), &mut small, combine, &mut scratch).unwrap();
            let mut ring = inputs[r].clone();
            ring_path::ring_allreduce(link, call(1), &mut ring, combine, &mut scratch).unwrap();
            let mut chosen = inputs[r].clone();
            if let Some(gather) = expect_gather {
                assert_eq!(
                    schedule::uses_gather(chosen.len() * 8, world),
                    gather,
                    "world {world} len {}",
                    chosen.len()
                );
            }
            allreduce(link, call(2), &mut chosen, combine, &mut scratch).unwrap();
            [bits(&small), bits(&ring), bits(&chosen)]
        })
    }

    #[test]
    fn both_paths_give_the_same_bits_for_every_length_and_world() {
        for world in 1..=16 {
            let mut lengths: Vec<usize> = (0..=2 * world + 1).collect();
            lengths.extend([100, 255, 511, 512, 513, 600]);
            for len in lengths {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                for (combine, name) in [
                    (fold::sum_f64 as fn(f64, f64) -> f64, "sum"),
                    (fold::max_f64 as fn(f64, f64) -> f64, "max"),
                ] {
                    let expected = bits(&reference(&inputs, combine));
                    for [small, ring, chosen] in three_ways(&inputs, combine, None) {
                        assert_eq!(small, expected, "{name} small world {world} len {len}");
                        assert_eq!(ring, expected, "{name} ring world {world} len {len}");
                        assert_eq!(chosen, expected, "{name} chosen world {world} len {len}");
                    }
                }
            }
        }
    }

    /// Every cut the cost model can choose: at the edge of the gather path for each world, the
    /// last length it takes and the first the ring takes give the oracle's bits on both paths.
    #[test]
    fn every_cut_of_the_model_gives_the_oracle_bits() {
        for world in 1..=16 {
            let edge = schedule::gather_limit(world) / 8; // the last gathered length
            for (len, gather) in [(edge - 1, true), (edge, true), (edge + 1, false)] {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let expected = bits(&reference(&inputs, fold::sum_f64));
                for [small, ring, chosen] in three_ways(&inputs, fold::sum_f64, Some(gather)) {
                    assert_eq!(small, expected, "small world {world} len {len}");
                    assert_eq!(ring, expected, "ring world {world} len {len}");
                    assert_eq!(chosen, expected, "chosen world {world} len {len}");
                }
            }
        }
    }

    /// No allocation per call in steady state: once a rank has made one call of each size,
    /// more calls of those sizes (the gather path below and above 4 KiB, the ring path with
    /// several slices) allocate nothing on its thread, link included.
    #[test]
    fn steady_state_calls_allocate_nothing() {
        let world = 4;
        let lengths = [1, 100, schedule::gather_limit(world) / 8, 3 * world * 32768 + 5];
        assert!(schedule::uses_gather(lengths[2] * 8, world) && lengths[2] * 8 > 4096);
        assert!(schedule::slices(lengths[3], world, 8) > 1);
        let counts = on_ring(Driver::new(world), |r, link| {
            let mut scratch = Scratch::default();
            let mut buffers: Vec<Vec<f64>> = lengths.iter().map(|&len| input(r, len)).collect();
            let mut seq = 0;
            let mut calls = |buffers: &mut Vec<Vec<f64>>| {
                for buf in buffers.iter_mut() {
                    let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq };
                    seq += 1;
                    allreduce(link, call, buf, fold::sum_f64, &mut scratch).unwrap();
                }
            };
            calls(&mut buffers);
            allocation_counter::measure(|| {
                for _ in 0..3 {
                    calls(&mut buffers);
                }
            })
            .count_total
        });
        assert_eq!(counts, vec![0; world], "allocations per rank in 12 steady-state calls");
    }

    #[test]
    fn integer_sums_wrap_and_max_propagates_nan_over_the_ring() {
        let world = 3;
        let results = on_ring(Driver::new(world), |r, link| {
            let mut ints = vec![i64::MAX; 1000];
            ints[1] = r as i64;
            let mut scratch = Scratch::default();
            allreduce(
                link,
                Call { rank: r, world, op: Op::AllreduceSumI64, seq: 0 },
                &mut ints,
                fold::sum_i64,
                &mut scratch,
            )
            .unwrap();
            let mut maxes = vec![r as f64; 600];
            if r == 2 {
                maxes[599] = f64::NAN;
            }
            allreduce(
                link,
                Call { rank: r, world, op: Op::AllreduceMaxF64, seq: 1 },
                &mut maxes,
                fold::max_f64,
                &mut scratch,
            )
            .unwrap();
            (ints, maxes)
        });
        for (ints, maxes) in results {
            assert_eq!(ints[0], i64::MAX.wrapping_mul(3));
            assert_eq!(ints[1], 3);
            assert_eq!(maxes[0], 2.0);
            assert!(maxes[599].is_nan());
        }
    }

    #[test]
    fn mismatched_lengths_are_caught_at_the_first_frame() {
        // World 2: a 1000-element buffer's segment is 4000 bytes, the same as a whole 500-element
        // buffer on the small path; the frame's total still tells them apart.
        let results = on_ring(Driver::new(2).sends_first(), |r, link| {
            let mut buf = vec![1.0; if r == 0 { 1000 } else { 500 }];
            allreduce(
                link,
                Call { rank: r, world: 2, op: Op::AllreduceSumF64, seq: 0 },
                &mut buf,
                fold::sum_f64,
                &mut Scratch::default(),
            )
        });
        assert_eq!(
            results[0],
            Err(CollectiveError::LengthMismatch { peer: 1, expected: 8000, got: 4000 })
        );
        assert_eq!(
            results[1],
            Err(CollectiveError::LengthMismatch { peer: 0, expected: 4000, got: 8000 })
        );
    }
}
