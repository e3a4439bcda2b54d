//! The shift: every rank sends a block to its right neighbour and receives one from its left,
//! all at once, on one way of one stream. It is what a step of the ring moves, alone, so its
//! time is a hop and the block's bytes at one stream's rate: the probe (`probe.rs`) times it to
//! measure that rate.
//!
//! Invariants: one way ([`Route::RIGHTWARD`]); a block of `bytes` goes as frames of at most
//! one buffer's length, every frame sent from that one buffer and received into another, so a
//! shift of megabytes holds two small buffers (what its frames carry is never read: each frame
//! in overwrites the one before). A frame's header is a two-way gather's first rightward frame
//! (`Op::AllgatherBytes`, [`Path::Gather`], rightward, the sender's rank as its block, the
//! block's length as its total) but for its own length: a receiver checks it as any other
//! frame. Both gates are always open.

use silvic_core::{CollectiveError, Op};

use super::seam::{Call, FramePlan, Link, Moved, Route};
use crate::frame::{Dir, Header, Path};

/// A shift of `total` bytes as a plan: frames of up to `out.len()` bytes, sent from `out` and
/// received into `into` (as long as `out`).
struct ShiftPlan<'a> {
    call: Call,
    total: u64,
    out: &'a [u8],
    into: &'a mut [u8],
    /// The frame coming in, and its bytes in so far.
    filling: (usize, usize),
}

impl ShiftPlan<'_> {
    /// The bytes of frame `i`.
    fn len(&self, i: usize) -> usize {
        let start = i * self.out.len();
        self.out.len().min(self.total as usize - start)
    }

    fn head(&self, i: usize, rank: usize) -> Header {
        let (total, len) = (self.total, self.len(i) as u64);
        let head = Header::data(Op::AllgatherBytes, self.call.seq, total, len).on(Path::Gather);
        head.carrying(Dir::Right, rank)
    }
}

impl FramePlan for ShiftPlan<'_> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &[Route::RIGHTWARD]
    }
    fn frames(&self, _: usize) -> usize {
        (self.total as usize).div_ceil(self.out.len().max(1)).max(1)
    }
    fn header(&self, _: usize, i: usize) -> Header {
        self.head(i, self.call.rank)
    }
    fn expect(&self, _: usize, j: usize) -> Header {
        self.head(j, Route::RIGHTWARD.receives_from(self.call.rank, self.call.world))
    }
    fn ready(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, _: usize, i: usize) -> &[u8] {
        &self.out[..self.len(i)]
    }
    fn space(&mut self, _: usize, j: usize) -> &mut [u8] {
        if self.filling.0 != j {
            self.filling = (j, 0);
        }
        let len = self.len(j);
        &mut self.into[self.filling.1..len]
    }
    fn commit(&mut self, _: usize, _: usize, n: usize) {
        self.filling.1 += n;
    }
}

/// Shifts a block of `total` bytes one rank to the right round the ring, as frames of up to
/// `out.len()` bytes sent from `out` (at least one byte long, unless `total` is 0): on return
/// `into` (as long as `out`) holds the left neighbour's last frame. Every rank passes the same
/// `total` and buffers of one length. The call's op is its frames' (`Op::AllgatherBytes`),
/// whatever `call.op` says.
pub(crate) fn shift(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    out: &[u8],
    into: &mut [u8],
) -> Result<(), CollectiveError> {
    debug_assert!(out.len() == into.len() && (total == 0 || !out.is_empty()));
    let call = Call { op: Op::AllgatherBytes, ..call };
    link.run(&mut ShiftPlan { call, total, out, into, filling: (0, 0) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Driver, on_ring};
    use crate::ring::oracle::assert_gates_keep_the_rule;

    #[test]
    fn every_rank_gets_its_left_neighbours_frames() {
        for world in 2..=9 {
            // One frame, a frame and a bit, several frames, nothing.
            for (total, frame) in [(7, 16), (17, 16), (48, 16), (0, 16), (1, 1)] {
                let got = on_ring(Driver::new(world), |r, link| {
                    let out: Vec<u8> = (0..frame).map(|i| (i * 7 + r * 31) as u8).collect();
                    let mut into = vec![0u8; frame];
                    let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 4 };
                    shift(link, call, total as u64, &out, &mut into).unwrap();
                    into
                });
                for (r, into) in got.into_iter().enumerate() {
                    let left = (r + world - 1) % world;
                    let last = match total % frame {
                        0 if total > 0 => frame,
                        0 => 0,
                        rest => rest,
                    };
                    let want: Vec<u8> = (0..last).map(|i| (i * 7 + left * 31) as u8).collect();
                    assert_eq!(into[..last], want, "world {world} total {total} rank {r}");
                }
            }
        }
    }

    #[test]
    fn a_block_of_another_length_is_refused_naming_the_left_neighbour() {
        let results = on_ring(Driver::new(3).sends_first(), |r, link| {
            let total = if r == 0 { 8 } else { 16 };
            let (out, mut into) = (vec![1u8; 16], vec![0u8; 16]);
            let call = Call { rank: r, world: 3, op: Op::AllgatherBytes, seq: 0 };
            shift(link, call, total, &out, &mut into)
        });
        assert_eq!(
            results[1],
            Err(CollectiveError::LengthMismatch { peer: 0, expected: 16, got: 8 })
        );
    }

    #[test]
    fn the_shifts_gates_keep_the_rule() {
        for world in 2..=5 {
            for rank in 0..world {
                let (out, mut into) = (vec![0u8; 3], vec![0u8; 3]);
                let call = Call { rank, world, op: Op::AllgatherBytes, seq: 0 };
                let plan =
                    ShiftPlan { call, total: 10, out: &out, into: &mut into, filling: (0, 0) };
                assert_gates_keep_the_rule(&plan, &format!("world {world} rank {rank}"));
            }
        }
    }
}
