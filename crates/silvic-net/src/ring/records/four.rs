//! The record reduce-scatter of a world of four in two steps instead of three, in the same fold
//! order as the ring's pass (block `j` folded over ranks `j + 1, j + 2, j + 3, j`, so the bits
//! are those of [`super::reduce_scatter_records`] at any world).
//!
//! Block `j`'s operands need not all ride the accumulator: two of them go one hop raw to the
//! rank where they are folded in, both ways at once, and the accumulator makes one hop:
//!
//! - **Step 1**, both ways: rank `j + 2` sends its bytes of block `j` leftward to rank `j + 1`,
//!   which folds them into its own (`acc = x[j+1]`, then `fold(acc, x[j+2])`), in place; rank
//!   `j + 3` sends its bytes of block `j` rightward to rank `j`, which keeps them aside.
//! - **Step 2**, leftward: once both its frames of step 1 are in, rank `j + 1` sends the
//!   accumulator to rank `j`, which folds what it kept and then its own bytes into it, piece by
//!   piece as it arrives, and writes the result over its own block. Waiting for the rightward
//!   frame too means no rank returns before both its neighbours have checked its frames of
//!   step 1, so a rank whose blocks differ fails with every other rank (where, without the
//!   wait, it could return before its right neighbour failed on its frame).
//!
//! Each rank sends three blocks a call, as in the ring's pass (two at step 1, one at step 2),
//! but waits on two hops instead of three. What each frame sends is never written by the call:
//! a rank folds in place only into blocks `r - 1` and `r`, and sends blocks `r + 1`, `r + 2` and
//! (once folded) `r - 1`. Lengths are checked as in the ring's pass: every frame carries its
//! block's length, checked against this rank's own blocks before a byte is used.

use std::ops::Range;

use silvic_core::{CollectiveError, RecordFold};

use super::super::seam::{Call, FramePlan, Link, Moved, Route};
use super::super::shared::{LEFTWARD, RIGHTWARD, Scratch, TWO_WAYS, wire_dir};
use super::fold_scratch;
use crate::frame::{Header, Path};

/// The world this plan serves.
pub(crate) const WORLD: usize = 4;

/// The plan of one rank (see the module doc). Blocks are named by offset from this rank `r`.
struct FourPlan<'a> {
    call: Call,
    buf: &'a mut [u8],
    bounds: &'a [Range<usize>],
    record: usize,
    fold: RecordFold<'a>,
    /// Received accumulator (or operand) bytes, folded in whole records as they fill.
    scratch: &'a mut [u8],
    /// Rank `r - 1`'s bytes of block `r`, kept for step 2.
    kept: &'a mut [u8],
    kept_len: usize,
    /// The leftward frame being received, its bytes in so far, and how many wait in `scratch`.
    filling: (usize, usize, usize),
}

/// The block rank `rank`'s outgoing frame `i` of `way` carries.
fn sent_block(rank: usize, way: usize, i: usize) -> usize {
    let offset = match (way, i) {
        (RIGHTWARD, _) => 1,
        (_, 0) => 2,
        _ => 3,
    };
    (rank + offset) % WORLD
}

/// The block rank `rank`'s incoming frame `j` of `way` carries: its neighbour's [`sent_block`].
fn received_block(rank: usize, way: usize, j: usize) -> usize {
    let offset = if (way, j) == (LEFTWARD, 0) { 3 } else { 0 };
    (rank + offset) % WORLD
}

impl FourPlan<'_> {
    fn frame_header(&self, way: usize, block: usize) -> Header {
        let len = self.bounds[block].len() as u64;
        let total = self.buf.len() as u64;
        let head = Header::data(self.call.op, self.call.seq, total, len).on(Path::Ring);
        head.carrying(wire_dir(way), block)
    }
}

impl FramePlan for FourPlan<'_> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &TWO_WAYS
    }
    fn frames(&self, way: usize) -> usize {
        if way == RIGHTWARD { 1 } else { 2 }
    }
    fn header(&self, way: usize, i: usize) -> Header {
        self.frame_header(way, sent_block(self.call.rank, way, i))
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        self.frame_header(way, received_block(self.call.rank, way, j))
    }
    /// The accumulator goes once the operand of step 1 is folded into it, and once the
    /// rightward frame of step 1 is in too: its header is checked by then, so the rank this
    /// accumulator completes cannot return before its own frames of step 1 have been checked
    /// by both its neighbours (a rank whose blocks differ fails, and so does every other).
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        way == RIGHTWARD
            || progress.sent[LEFTWARD] == 0
            || (progress.received[LEFTWARD] >= 1 && progress.received[RIGHTWARD] >= 1)
    }
    /// The accumulator of this rank's block is folded as it comes, after the kept operand: it
    /// comes in once that is all in (a frame of the earlier way, as the seam's rule allows).
    fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool {
        way == RIGHTWARD || progress.received[LEFTWARD] == 0 || progress.received[RIGHTWARD] >= 1
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        &self.buf[self.bounds[sent_block(self.call.rank, way, i)].clone()]
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        if way == RIGHTWARD {
            let (at, len) = (self.kept_len, self.kept.len());
            return &mut self.kept[at..len];
        }
        if self.filling.0 != j {
            self.filling = (j, 0, 0);
        }
        let (_, bytes, pending) = self.filling;
        let left = self.bounds[received_block(self.call.rank, way, j)].len() - bytes;
        let room = (self.scratch.len() - pending).min(left);
        &mut self.scratch[pending..pending + room]
    }
    fn commit(&mut self, way: usize, j: usize, n: usize) {
        if way == RIGHTWARD {
            self.kept_len += n;
            return;
        }
        let block = self.bounds[received_block(self.call.rank, way, j)].clone();
        let (_, bytes, pending) = &mut self.filling;
        let folded = *bytes - *pending;
        *bytes += n;
        *pending += n;
        let whole = *pending / self.record * self.record;
        let rest = *pending;
        *pending -= whole;
        let mine = &mut self.buf[block.start + folded..][..whole];
        let came = &mut self.scratch[..whole];
        if j == 0 {
            // Rank `r + 1`'s operand of block `r - 1`: this rank's bytes are the accumulator.
            (self.fold)(mine, came);
        } else {
            // The accumulator of block `r`: then rank `r - 1`'s bytes, then this rank's.
            (self.fold)(came, &self.kept[folded..folded + whole]);
            (self.fold)(came, mine);
            mine.copy_from_slice(came);
        }
        self.scratch.copy_within(whole..rest, 0);
    }
}

/// The reduce-scatter of a world of four over checked `bounds` (see the module doc).
pub(crate) fn scatter(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [u8],
    bounds: &[Range<usize>],
    record: usize,
    fold: RecordFold<'_>,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    debug_assert_eq!(call.world, WORLD);
    let kept_len = bounds[call.rank].len();
    let folding = fold_scratch(scratch, record).len();
    scratch.fold.resize(scratch.fold.len().max(folding + kept_len), 0);
    let (scratch, kept) = scratch.fold.split_at_mut(folding);
    let mut plan = FourPlan {
        call,
        buf,
        bounds,
        record,
        fold,
        scratch,
        kept: &mut kept[..kept_len],
        kept_len: 0,
        filling: (usize::MAX, 0, 0),
    };
    link.run(&mut plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::oracle::assert_gates_keep_the_rule;
    use silvic_core::Op;

    fn fold(acc: &mut [u8], next: &[u8]) {
        for (a, n) in acc.iter_mut().zip(next) {
            *a = a.wrapping_mul(3).wrapping_add(*n);
        }
    }

    #[test]
    fn four_plan_gates_look_only_at_earlier_frames() {
        let bounds: Vec<Range<usize>> = (0..WORLD).map(|j| j..j + 1).collect();
        let mut buf = vec![0u8; WORLD];
        let (mut scratch, mut kept) = ([0u8; 4], [0u8; 1]);
        for rank in 0..WORLD {
            let call = Call { rank, world: WORLD, op: Op::ReduceScatterRecords, seq: 0 };
            let plan = FourPlan {
                call,
                buf: &mut buf,
                bounds: &bounds,
                record: 1,
                fold: &fold,
                scratch: &mut scratch,
                kept: &mut kept,
                kept_len: 0,
                filling: (usize::MAX, 0, 0),
            };
            assert_gates_keep_the_rule(&plan, &format!("rank {rank}"));
        }
    }

    /// What a rank receives on each frame is what its neighbour on that way sends.
    #[test]
    fn every_received_block_is_the_neighbours_sent_block() {
        for rank in 0..WORLD {
            for (way, frame) in [(RIGHTWARD, 0), (LEFTWARD, 0), (LEFTWARD, 1)] {
                let sender = TWO_WAYS[way].receives_from(rank, WORLD);
                let (got, sent) =
                    (received_block(rank, way, frame), sent_block(sender, way, frame));
                assert_eq!(got, sent, "rank {rank} way {way} frame {frame} from rank {sender}");
            }
            // Block `r` comes twice (the kept operand, then the accumulator), block `r - 1`
            // once, and this rank folds only into those two: never into a block it sends.
            let sent: Vec<usize> = [(RIGHTWARD, 0), (LEFTWARD, 0), (LEFTWARD, 1)]
                .map(|(way, i)| sent_block(rank, way, i))
                .into();
            assert_eq!(sent, [(rank + 1) % WORLD, (rank + 2) % WORLD, (rank + 3) % WORLD]);
        }
    }
}
