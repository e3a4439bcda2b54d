//! The record plans: the reduce-scatter of the caller's blocks with the caller's fold over
//! fixed-size records ([`reduce_scatter_records`]), and the allreduce made of it and a gather
//! ([`allreduce_records`]).
//!
//! The reduce-scatter is one rightward pass of `world - 1` frames (the leftward way carries
//! none), except in a world of four, where [`four`] takes two steps in the same fold order. At step `s` rank `r` sends
//! block `r - 1 - s` and receives block `r - 2 - s`, folding what comes in (the accumulator)
//! with its own bytes of that block, so block `j` sets off from rank `j + 1`, gathers one rank
//! per step and ends, whole, at its owner `j`:
//!
//! - **Fold order.** Block `j` folds over ranks `j + 1, j + 2, …, j` (mod world), left to
//!   right, `acc = fold(acc, next)`: a function of the block and the world alone, so the bits
//!   are the same on every rank and run.
//! - **Lengths.** Every frame carries its block's length, and the header the whole buffer's;
//!   both are checked against this rank's own blocks before a byte is folded, so ranks that
//!   cut their buffers differently fail at the first block they disagree on (every rank sends
//!   or receives every block). Nothing is sized from the wire: the fold scratch is sized from
//!   the record size the caller passed.
//! - **Nothing is overwritten before it is sent.** A frame comes in once the frame before it is
//!   out (as the ring path's reduce-scatter), and block `r - 2 - s`, folded at step `s`, is first
//!   sent at step `s + 1`.
//!
//! [`allgather_blocks_on`] gathers blocks of lengths every rank knows in one two-way gather (the
//! allreduce's second half, and LightGBM's allgather).
//!
//! The allreduce cuts the records into [`segment`]s, one block per rank, reduces
//! them so, then gathers the owned blocks both ways round the ring ([`super::gather`]).

use std::ops::Range;

use silvic_core::{CollectiveError, RecordFold, block_bounds};

use super::gather;
use super::schedule::{pass, segment};
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::shared::{Blocks, FOLD_SCRATCH, RIGHTWARD, Scratch, TWO_WAYS};
use crate::frame::{Dir, Header, Path};

mod four;

/// The reduce-scatter as a plan (see the module doc).
struct ScatterPlan<'a> {
    call: Call,
    buf: &'a mut [u8],
    bounds: &'a [Range<usize>],
    record: usize,
    fold: RecordFold<'a>,
    /// Whole records of received bytes, folded as they fill.
    scratch: &'a mut [u8],
    /// The frame being received, its bytes in so far, and how many of them wait in `scratch`.
    filling: (usize, usize, usize),
}

impl ScatterPlan<'_> {
    /// The blocks frame `i` sends and receives.
    fn moves(&self, i: usize) -> (usize, usize) {
        let Call { rank, world, .. } = self.call;
        let p = pass(rank, world, i, world - 1);
        (p.send, p.recv)
    }

    fn frame_header(&self, block: usize) -> Header {
        let len = self.bounds[block].len() as u64;
        let total = self.buf.len() as u64;
        let head = Header::data(self.call.op, self.call.seq, total, len).on(Path::Ring);
        head.carrying(Dir::Right, block)
    }
}

impl FramePlan for ScatterPlan<'_> {
    fn call(&self) -> Call {
        self.call
    }
    /// Both ways, as every plan a two-stream link runs; the leftward one carries nothing.
    fn ways(&self) -> &[Route] {
        &TWO_WAYS
    }
    fn frames(&self, way: usize) -> usize {
        if way == RIGHTWARD { self.call.world - 1 } else { 0 }
    }
    fn header(&self, _: usize, i: usize) -> Header {
        self.frame_header(self.moves(i).0)
    }
    fn expect(&self, _: usize, j: usize) -> Header {
        self.frame_header(self.moves(j).1)
    }
    fn ready(&self, _: usize, progress: Moved<'_>) -> bool {
        let i = progress.sent[RIGHTWARD];
        i == 0 || progress.received[RIGHTWARD] >= i
    }
    fn may_receive(&self, _: usize, progress: Moved<'_>) -> bool {
        progress.received[RIGHTWARD] <= progress.sent[RIGHTWARD]
    }
    fn payload(&self, _: usize, i: usize) -> &[u8] {
        &self.buf[self.bounds[self.moves(i).0].clone()]
    }
    fn space(&mut self, _: usize, j: usize) -> &mut [u8] {
        if self.filling.0 != j {
            self.filling = (j, 0, 0);
        }
        let (_, bytes, pending) = self.filling;
        let left = self.bounds[self.moves(j).1].len() - bytes;
        let room = (self.scratch.len() - pending).min(left);
        &mut self.scratch[pending..pending + room]
    }
    fn commit(&mut self, _: usize, j: usize, n: usize) {
        let block = self.bounds[self.moves(j).1].clone();
        let (_, bytes, pending) = &mut self.filling;
        let folded = *bytes - *pending;
        *bytes += n;
        *pending += n;
        let whole = *pending / self.record * self.record;
        let rest = *pending;
        *pending -= whole;
        // The received bytes are the accumulator; this rank's are the next in fold order.
        let mine = &mut self.buf[block.start + folded..][..whole];
        (self.fold)(&mut self.scratch[..whole], mine);
        mine.copy_from_slice(&self.scratch[..whole]);
        self.scratch.copy_within(whole..rest, 0);
    }
}

/// The fold scratch of a call with `record`-byte records: whole records, at least one.
fn fold_scratch(scratch: &mut Scratch, record: usize) -> &mut [u8] {
    let size = (FOLD_SCRATCH / record).max(1) * record;
    scratch.fold.resize(size.max(scratch.fold.len()), 0);
    &mut scratch.fold[..size]
}

/// Reduces `buf`, cut into `blocks` (bytes, end to end), with `fold` over `record`-byte
/// records: on return this rank's block holds the fold of every rank's, in the module doc's
/// order. The arguments are checked first ([`block_bounds`]).
pub(crate) fn reduce_scatter_records(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    blocks: &[usize],
    record: usize,
    fold: RecordFold<'_>,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let bounds = block_bounds(buf.len(), blocks, record, call.world)?;
    scatter(link, call, buf, &bounds, record, fold, scratch)
}

fn scatter(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    bounds: &[Range<usize>],
    record: usize,
    fold: RecordFold<'_>,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    if call.world == four::WORLD {
        return four::scatter(link, call, buf, bounds, record, fold, scratch);
    }
    let scratch = fold_scratch(scratch, record);
    let mut plan =
        ScatterPlan { call, buf, bounds, record, fold, scratch, filling: (usize::MAX, 0, 0) };
    link.run(&mut plan)
}

/// Blocks at fixed ranges of one buffer, each whole on the rank that owns it.
struct Spans<'a> {
    buf: &'a mut [u8],
    bounds: &'a [Range<usize>],
}

impl Blocks for Spans<'_> {
    fn block(&self, rank: usize) -> &[u8] {
        &self.buf[self.bounds[rank].clone()]
    }
    fn room(&mut self, rank: usize, filled: usize) -> &mut [u8] {
        &mut self.buf[self.bounds[rank].clone()][filled..]
    }
}

/// Gathers `buf`'s `blocks` (bytes, end to end; this rank's holds its bytes), each frame
/// carrying its block's length, checked against this rank's own layout: one two-way gather
/// ([`Path::Gather`]), or Bruck's `ceil(log2 n)` rounds over chord streams ([`Path::Bruck`]).
/// The same blocks either way.
pub(crate) fn allgather_blocks_on(
    path: Path,
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    blocks: &[usize],
) -> Result<(), CollectiveError> {
    let bounds = block_bounds(buf.len(), blocks, 1, call.world)?;
    let total = buf.len() as u64;
    let spans = &mut Spans { buf, bounds: &bounds };
    match path {
        Path::Bruck => super::bruck::bruck_gather(link, call, total, spans),
        _ => gather::gather(link, call, total, spans),
    }
}

/// Replaces `buf`, whole `record`-byte records, with its fold over the ring: a reduce-scatter
/// of one [`segment`] of records per rank, then the owned blocks gathered.
pub(crate) fn allreduce_records(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    record: usize,
    fold: RecordFold<'_>,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    // Checks the record size against the whole buffer, one block for a world of one.
    block_bounds(buf.len(), &[buf.len()], record, 1)?;
    let records = buf.len() / record;
    let bounds: Vec<Range<usize>> = (0..call.world)
        .map(|j| {
            let s = segment(records, call.world, j);
            s.start * record..s.end * record
        })
        .collect();
    scatter(link, call, buf, &bounds, record, fold, scratch)?;
    // One call, one path in every frame: the reduce-scatter's, the ring's.
    let total = buf.len() as u64;
    gather::gather_of(Path::Ring, link, call, total, &mut Spans { buf, bounds: &bounds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Dice, Driver, on_ring};
    use crate::ring::oracle::assert_gates_keep_the_rule;
    use silvic_core::Op;

    /// A fold whose result shows the order: each 12-byte record is (f64, u32), a sum of floats
    /// that do not associate and `31 × acc + next`, which does not commute, so any other
    /// order (or the operands swapped) gives other bits.
    fn fold(acc: &mut [u8], next: &[u8]) {
        for (a, n) in acc.chunks_exact_mut(12).zip(next.chunks_exact(12)) {
            let f = |b: &[u8]| f64::from_le_bytes(b[..8].try_into().unwrap());
            let c = |b: &[u8]| u32::from_le_bytes(b[8..].try_into().unwrap());
            let (sum, count) = (f(a) + f(n), c(a).wrapping_mul(31).wrapping_add(c(n)));
            a[..8].copy_from_slice(&sum.to_le_bytes());
            a[8..].copy_from_slice(&count.to_le_bytes());
        }
    }

    fn record(rank: usize, k: usize) -> [u8; 12] {
        let value = ((k * 7 + rank * 13) % 17) as f64 * 0.1 + 1e16 * (rank % 2) as f64;
        let mut r = [0u8; 12];
        r[..8].copy_from_slice(&value.to_le_bytes());
        r[8..].copy_from_slice(&(1u32 << rank.min(31)).to_le_bytes());
        r
    }

    fn records(rank: usize, n: usize) -> Vec<u8> {
        (0..n).flat_map(|k| record(rank, k)).collect()
    }

    /// The oracle: record `k` of block `j` folded over ranks `j + 1, …, j`.
    fn folded(world: usize, j: usize, k: usize) -> Vec<u8> {
        let mut acc = record((j + 1) % world, k).to_vec();
        for step in 2..=world {
            fold(&mut acc, &record((j + step) % world, k));
        }
        acc
    }

    /// Block lengths, in records, at the edges: empty blocks, one record, unequal blocks.
    fn layouts(world: usize) -> Vec<Vec<usize>> {
        let mut dice = Dice(0x5eed ^ world as u64);
        vec![
            vec![0; world],
            vec![1; world],
            (0..world).map(|j| j % 3).collect(),
            (0..world).map(|j| if j == world - 1 { 5 } else { 0 }).collect(),
            (0..world).map(|_| dice.below(40)).collect(),
            (0..world).map(|j| 1 + (j * 37) % 11).collect(),
        ]
    }

    #[test]
    fn reduce_scatter_equals_the_fold_order_oracle() {
        for world in 1..=16 {
            for layout in layouts(world) {
                let blocks: Vec<usize> = layout.iter().map(|n| n * 12).collect();
                let total: usize = layout.iter().sum();
                let starts: Vec<usize> =
                    layout.iter().scan(0, |at, n| Some(std::mem::replace(at, *at + n))).collect();
                let driver = Driver::new(world).seed(world as u64).capacity(2).piece(7);
                let results = on_ring(driver, |r, link| {
                    let mut buf = records(r, total);
                    // Record k of the buffer is record k of its block's value set.
                    let call = Call { rank: r, world, op: Op::ReduceScatterRecords, seq: 0 };
                    let mut scratch = Scratch::default();
                    reduce_scatter_records(link, call, &mut buf, &blocks, 12, &fold, &mut scratch)
                        .unwrap();
                    buf[starts[r] * 12..][..blocks[r]].to_vec()
                });
                for (r, got) in results.into_iter().enumerate() {
                    let want: Vec<u8> =
                        (0..layout[r]).flat_map(|k| folded(world, r, starts[r] + k)).collect();
                    assert!(got == want, "world {world} layout {layout:?} rank {r}");
                }
            }
        }
    }

    /// Blocks longer than the fold scratch are folded in many pieces, a record split across
    /// two of them, at the worlds round the two-step plan of a world of four.
    #[test]
    fn blocks_longer_than_the_fold_scratch_fold_in_order() {
        for world in [3, 4, 5] {
            let layout: Vec<usize> = (0..world).map(|j| FOLD_SCRATCH / 12 + 1 + 3 * j).collect();
            let blocks: Vec<usize> = layout.iter().map(|n| n * 12).collect();
            let total: usize = layout.iter().sum();
            let start = |r: usize| layout[..r].iter().sum::<usize>();
            let driver = Driver::new(world).seed(7).capacity(2).piece(40_009);
            let results = on_ring(driver, |r, link| {
                let mut buf = records(r, total);
                let call = Call { rank: r, world, op: Op::ReduceScatterRecords, seq: 0 };
                let scratch = &mut Scratch::default();
                reduce_scatter_records(link, call, &mut buf, &blocks, 12, &fold, scratch).unwrap();
                buf[start(r) * 12..][..blocks[r]].to_vec()
            });
            for (r, got) in results.into_iter().enumerate() {
                let want: Vec<u8> =
                    (0..layout[r]).flat_map(|k| folded(world, r, start(r) + k)).collect();
                assert!(got == want, "world {world} rank {r}");
            }
        }
    }

    #[test]
    fn allreduce_records_gives_every_rank_the_oracle_bits() {
        for world in 1..=16 {
            for n in [0, 1, world - 1, world, world + 1, 3 * world + 2, 200] {
                let results = on_ring(Driver::new(world).capacity(3).piece(5), |r, link| {
                    let mut buf = records(r, n);
                    let call = Call { rank: r, world, op: Op::AllreduceRecords, seq: 0 };
                    allreduce_records(link, call, &mut buf, 12, &fold, &mut Scratch::default())
                        .unwrap();
                    buf
                });
                for (r, got) in results.into_iter().enumerate() {
                    let want: Vec<u8> = (0..n)
                        .flat_map(|k| {
                            let j = (0..world).find(|&j| segment(n, world, j).contains(&k));
                            folded(world, j.unwrap(), k)
                        })
                        .collect();
                    assert!(got == want, "world {world} records {n} rank {r}");
                }
            }
        }
    }

    /// Ranks that cut their buffers into other blocks fail at the first block they disagree
    /// on, naming the neighbour, before a byte of it is folded.
    #[test]
    fn allgather_blocks_fills_every_block_at_the_edges() {
        for world in 1..=16 {
            for layout in layouts(world) {
                let bounds = block_bounds(layout.iter().sum(), &layout, 1, world).unwrap();
                let whole: Vec<u8> = (0..layout.iter().sum::<usize>()).map(|i| i as u8).collect();
                let results = on_ring(Driver::new(world).capacity(2).piece(3), |r, link| {
                    let mut buf = vec![0u8; whole.len()];
                    buf[bounds[r].clone()].copy_from_slice(&whole[bounds[r].clone()]);
                    let call = Call { rank: r, world, op: Op::AllgatherBlocks, seq: 0 };
                    crate::ring::allgather_blocks(link, call, &mut buf, &layout).unwrap();
                    buf
                });
                for (r, got) in results.into_iter().enumerate() {
                    assert!(got == whole, "world {world} layout {layout:?} rank {r}");
                }
            }
        }
    }

    #[test]
    fn other_block_lengths_fail_naming_the_neighbour() {
        let results = on_ring(Driver::new(3), |r, link| {
            let blocks = if r == 1 { [24, 12, 12] } else { [12, 24, 12] };
            let mut buf = records(r, 4);
            let call = Call { rank: r, world: 3, op: Op::ReduceScatterRecords, seq: 0 };
            reduce_scatter_records(
                link,
                call,
                &mut buf,
                &blocks,
                12,
                &fold,
                &mut Scratch::default(),
            )
        });
        // The in-memory driver relays no aborts: a rank behind the one that failed sees its
        // left neighbour close. Every error names the left neighbour, and the first is the
        // length check.
        let malformed = |e: &CollectiveError| matches!(e, CollectiveError::MalformedFrame { .. });
        assert!(results.iter().any(|r| r.as_ref().is_err_and(malformed)), "{results:?}");
        for (r, result) in results.iter().enumerate() {
            if let Err(e) = result {
                assert_eq!(e.peer(), Some((r + 2) % 3), "rank {r}: {e}");
            }
        }
    }

    #[test]
    fn a_record_size_that_does_not_divide_a_block_is_refused_before_any_frame() {
        let results = on_ring(Driver::new(2), |r, link| {
            let mut buf = vec![0u8; 20];
            let call = Call { rank: r, world: 2, op: Op::ReduceScatterRecords, seq: 0 };
            let scratch = &mut Scratch::default();
            let refused =
                reduce_scatter_records(link, call, &mut buf, &[10, 10], 4, &fold, scratch);
            (refused, link.sent.clone())
        });
        for (refused, sent) in results {
            assert_eq!(refused.unwrap_err().kind(), "invalid_argument");
            assert!(sent.iter().all(|&n| n == 0), "{sent:?}");
        }
    }

    #[test]
    fn scatter_gates_look_only_at_earlier_frames() {
        for world in 1..=16 {
            let bounds: Vec<Range<usize>> = (0..world).map(|j| j..j + 1).collect();
            let mut buf = vec![0u8; world];
            let mut scratch = [0u8; 4];
            for rank in 0..world {
                let call = Call { rank, world, op: Op::ReduceScatterRecords, seq: 0 };
                let plan = ScatterPlan {
                    call,
                    buf: &mut buf,
                    bounds: &bounds,
                    record: 1,
                    fold: &fold,
                    scratch: &mut scratch,
                    filling: (usize::MAX, 0, 0),
                };
                assert_gates_keep_the_rule(&plan, &format!("world {world} rank {rank}"));
            }
        }
    }
}
