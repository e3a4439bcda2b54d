//! The ring algorithms: which bytes move in which frame, and how they are folded; and the
//! dispatcher that runs the path the choice picks.
//!
//! The modules, by concept:
//!
//! - [`seam`]: what a link imports (the plan and link traits, per-way [`seam::Moved`], the
//!   rule that keeps gates from waiting in a circle, and how a driver runs a plan);
//! - [`choice`]: which path an allreduce takes (the measured network, the cost model and the
//!   rule), pure;
//! - the plans, one file each: [`gather`] (the two-way allgather: `allgather_bytes` and the
//!   allreduce's gather path), [`ring_path`] (the reduce-scatter and gather of slices),
//!   [`bruck`] (Bruck's allgather and the allreduce made of it), [`index`]
//!   (index-fold-gather), [`records`] (the record reduce-scatter and allreduce, and the
//!   allgather of known blocks), [`varlen`] (the variable-length allgather and the broadcast),
//!   [`shift`] (a block to the right neighbour: what the probe times);
//! - [`shared`]: what the plans share (the two ways, [`Scratch`], the blocks of a gather, the
//!   allreduce by gathering and folding);
//! - [`schedule`], [`twoway`] and [`log_depth`]: the pure arithmetic the plans and the cost
//!   model are built on; [`element`]: the numbers as the bytes payloads carry;
//! - `mem` (tests only): one deterministic in-memory driver that runs real calls on every rank
//!   (the simulator's virtual-time driver, `simulate/`, runs the same plans without bytes);
//!   `lockstep` (tests only) moves every rank's plan in one thread over streams named by rank
//!   pairs, and `plan_checks` (tests only) checks plans of any number of ways without running
//!   them: the stream-sharing rule, distinct headers, nothing overwritten in flight.
//!
//! Imports run one way: this file imports the plans and the choice; a plan imports the seam,
//! [`shared`], the arithmetic and plans below it (the index Bruck's rounds, the records the
//! gather), never this file or the choice; the choice imports only the arithmetic.
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
//!   on `(i, len, world)` alone, and every path uses it, so results are bitwise identical on
//!   every rank, on every run, and on every path, wherever the cut falls.
//! - **One choice, the same on every rank.** [`choice::choose`] picks the path from the buffer
//!   size, the world and what every rank agreed on when the ring formed, so every rank picks
//!   the same.
//! - **Traffic and memory.** The ring path is a reduce-scatter round the ring, then the reduced
//!   segments gathered both ways round it at once ([`twoway`]): `n - 1 + floor(n/2)` hops,
//!   `2(n-1)/n` of the buffer leaving each rank, and the only extra memory a fixed-size fold
//!   scratch. Each segment is cut into [`schedule::slices_of`] of the same count, and a rank
//!   forwards a slice as soon as it has folded it, while the next slice sets off behind it. The
//!   gather path is one two-way allgather of whole buffers (`floor(n/2)` hops, each block
//!   forwarded as soon as it is in); it holds `n × bytes`, at most `max(GATHER_MAX_BYTES, n × 4
//!   KiB)` ([`choice::GATHER_MAX_BYTES`]), kept in [`Scratch`] so that a steady state allocates
//!   nothing per call.
//!
//! Not here: sockets, clocks and failure handling. [`Link`] is the seam: the TCP ring plugs in
//! over poll(2), and the tests plug in the in-memory driver.

pub(crate) mod bruck;
pub(crate) mod choice;
#[cfg(test)]
pub(crate) mod circular;
pub(crate) mod element;
#[cfg(test)]
mod fixed_tests;
pub(crate) mod gather;
pub(crate) mod index;
pub(crate) mod layout;
#[cfg(test)]
pub(crate) mod lockstep;
pub(crate) mod log_depth;
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
pub(crate) mod shared;
pub(crate) mod shift;
pub(crate) mod twoway;
pub(crate) mod varlen;

use silvic_core::{CollectiveError, Numbers, Reduction, fold};

use choice::{Path, Shape};
pub(crate) use element::Element;
pub(crate) use seam::{Call, Link};
pub(crate) use shared::{Scratch, fold_gathered};

/// Replaces `buf` with its reduction over the ring, `combine` folding in fold order, on the
/// path [`choice::choose`] picks (the link's forced path where it carries the call).
pub(crate) fn allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let shape = Shape { bytes: size_of_val(buf), elem: size_of::<T>(), world: call.world };
    let choice = choice::choose(shape, link.network(), link.forced());
    allreduce_on(choice.path, link, call, buf, combine, scratch)
}

/// [`allreduce`] on the path `path`, whatever the choice says (the probes and the simulator
/// force paths): every path gives the same bits. The log-depth paths ([`bruck`], [`index`])
/// route frames to `rank ± 2^k`, which only a link with chord streams carries.
pub(crate) fn allreduce_on<T: Element, C: Fn(T, T) -> T + Copy>(
    path: Path,
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    match path {
        Path::Gather => gather::gather_allreduce(link, call, buf, combine, scratch),
        Path::Ring => ring_path::ring_allreduce(link, call, buf, combine, scratch),
        Path::Bruck => bruck::bruck_allreduce(link, call, buf, combine, scratch),
        Path::Index => index::index_allreduce(link, call, buf, combine, scratch),
    }
}

/// Allgathers one equal-length block per rank: on return `blocks[r]` holds rank `r`'s block.
/// `blocks[rank]` is this rank's on entry. `total` is the length the frames report. The
/// two-way gather, or Bruck's rounds where [`choice::allgather_path`] says: the same blocks.
pub(crate) fn allgather(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    blocks: &mut [Vec<u8>],
) -> Result<(), CollectiveError> {
    debug_assert_eq!(blocks.len(), call.world);
    let block = blocks[call.rank].len();
    for b in blocks.iter_mut() {
        b.resize(block, 0);
    }
    match choice::allgather_path(link.network()) {
        Path::Bruck => bruck::bruck_gather(link, call, total, blocks),
        _ => gather::gather(link, call, total, blocks),
    }
}

/// Gathers `buf`'s `blocks` (bytes, end to end; this rank's holds its bytes), each frame
/// carrying its block's length, checked against this rank's own layout, on the path
/// [`choice::allgather_path`] says ([`records::allgather_blocks_on`]).
pub(crate) fn allgather_blocks(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    blocks: &[usize],
) -> Result<(), CollectiveError> {
    let path = choice::allgather_path(link.network());
    records::allgather_blocks_on(path, link, call, buf, blocks)
}

/// What runs one allreduce of any element type: a link alone (`OnLink`), or a rank's
/// channels (`channels.rs`).
pub(crate) trait Reducer {
    /// Replaces `buf` with its reduction over the ring, `combine` folding in fold order.
    fn reduce<T: Element, C: Fn(T, T) -> T + Copy + Send + Sync>(
        &mut self,
        call: Call,
        buf: &mut [T],
        combine: C,
    ) -> Result<(), CollectiveError>;
}

/// One link and its scratch: [`allreduce`] on the path the choice picks (what the fuzzers and
/// the in-memory tests reduce on; a `TcpCollective` reduces on its channels).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) struct OnLink<'a> {
    pub(crate) link: &'a mut dyn Link,
    pub(crate) scratch: &'a mut Scratch,
}

#[cfg(any(test, feature = "fuzzing"))]
impl Reducer for OnLink<'_> {
    fn reduce<T: Element, C: Fn(T, T) -> T + Copy + Send + Sync>(
        &mut self,
        call: Call,
        buf: &mut [T],
        combine: C,
    ) -> Result<(), CollectiveError> {
        allreduce(self.link, call, buf, combine, self.scratch)
    }
}

/// The allreduce of a typed buffer by `reducer`, with `reduction`'s combiner for its element
/// type.
pub(crate) fn allreduce_numbers(
    reducer: &mut impl Reducer,
    call: Call,
    buf: Numbers<'_>,
    reduction: Reduction,
) -> Result<(), CollectiveError> {
    use Reduction::{Max, Min, Sum};
    let (r, c) = (reducer, call);
    match (buf, reduction) {
        (Numbers::F32(b), Sum) => r.reduce(c, b, fold::sum_f32),
        (Numbers::F32(b), Min) => r.reduce(c, b, fold::min_f32),
        (Numbers::F32(b), Max) => r.reduce(c, b, fold::max_f32),
        (Numbers::F64(b), Sum) => r.reduce(c, b, fold::sum_f64),
        (Numbers::F64(b), Min) => r.reduce(c, b, fold::min_f64),
        (Numbers::F64(b), Max) => r.reduce(c, b, fold::max_f64),
        (Numbers::I32(b), Sum) => r.reduce(c, b, fold::sum_i32),
        (Numbers::I32(b), Min) => r.reduce(c, b, fold::min_int),
        (Numbers::I32(b), Max) => r.reduce(c, b, fold::max_int),
        (Numbers::I64(b), Sum) => r.reduce(c, b, fold::sum_i64),
        (Numbers::I64(b), Min) => r.reduce(c, b, fold::min_int),
        (Numbers::I64(b), Max) => r.reduce(c, b, fold::max_int),
        (Numbers::U64(b), Sum) => r.reduce(c, b, fold::sum_u64),
        (Numbers::U64(b), Min) => r.reduce(c, b, fold::min_int),
        (Numbers::U64(b), Max) => r.reduce(c, b, fold::max_int),
        (Numbers::I128(b), Sum) => r.reduce(c, b, fold::sum_i128),
        (Numbers::I128(b), Min) => r.reduce(c, b, fold::min_int),
        (Numbers::I128(b), Max) => r.reduce(c, b, fold::max_int),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mem::{Driver, on_ring};
    use oracle::{bits, input, reference};
    use silvic_core::Op;

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
                    choice::uses_gather(chosen.len() * 8, world),
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
            let edge = choice::gather_limit(world) / 8; // the last gathered length
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
        let lengths = [1, 100, choice::gather_limit(world) / 8, 3 * world * 32768 + 5];
        assert!(choice::uses_gather(lengths[2] * 8, world) && lengths[2] * 8 > 4096);
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
