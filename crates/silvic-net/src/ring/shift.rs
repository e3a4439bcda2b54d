//! The shift: every rank sends one block to its right neighbour and receives one from its left,
//! all at once, one frame each way of one stream. It is what a step of the ring moves, alone,
//! so its time is a hop and the block's bytes at one stream's rate: the probe (`probe.rs`)
//! times it to measure that rate.
//!
//! Invariants: one way ([`Route::RIGHTWARD`]), one frame, whose header is the first rightward
//! frame of a two-way gather of the same blocks (`Op::AllgatherBytes`, [`Path::Gather`],
//! rightward, the sender's rank as its block, the block's length as its total): a receiver
//! checks it as any other frame. The frame out and the frame in have their own buffers, so both
//! gates are always open.

use silvic_core::{CollectiveError, Op};

use super::seam::{Call, FramePlan, Link, Moved, Route};
use crate::frame::{Dir, Header, Path};

/// The shift of `out` as a plan: `into` takes the left neighbour's block, as long as `out`.
struct ShiftPlan<'a> {
    call: Call,
    out: &'a [u8],
    into: &'a mut [u8],
    filled: usize,
}

impl ShiftPlan<'_> {
    fn head(&self, rank: usize) -> Header {
        let len = self.out.len() as u64;
        Header::data(Op::AllgatherBytes, self.call.seq, len, len)
            .on(Path::Gather)
            .carrying(Dir::Right, rank)
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
        1
    }
    fn header(&self, _: usize, _: usize) -> Header {
        self.head(self.call.rank)
    }
    fn expect(&self, _: usize, _: usize) -> Header {
        self.head(Route::RIGHTWARD.receives_from(self.call.rank, self.call.world))
    }
    fn ready(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, _: usize, _: usize) -> &[u8] {
        self.out
    }
    fn space(&mut self, _: usize, _: usize) -> &mut [u8] {
        &mut self.into[self.filled..]
    }
    fn commit(&mut self, _: usize, _: usize, n: usize) {
        self.filled += n;
    }
}

/// Shifts `out` one rank to the right round the ring: on return `into` holds the left
/// neighbour's `out` (every rank passes blocks of one length; `into` is as long as `out`).
/// The call's op is its frames' (`Op::AllgatherBytes`), whatever `call.op` says.
pub(crate) fn shift(
    link: &mut dyn Link,
    call: Call,
    out: &[u8],
    into: &mut [u8],
) -> Result<(), CollectiveError> {
    debug_assert_eq!(out.len(), into.len());
    let call = Call { op: Op::AllgatherBytes, ..call };
    link.run(&mut ShiftPlan { call, out, into, filled: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::mem::{Driver, on_ring};
    use crate::ring::oracle::assert_gates_keep_the_rule;

    #[test]
    fn every_rank_gets_its_left_neighbours_block() {
        for world in 2..=9 {
            for len in [0, 1, 7, 5000] {
                let got = on_ring(Driver::new(world), |r, link| {
                    let out: Vec<u8> = (0..len).map(|i| (i * 7 + r * 31) as u8).collect();
                    let mut into = vec![0u8; len];
                    let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 4 };
                    shift(link, call, &out, &mut into).unwrap();
                    into
                });
                for (r, into) in got.into_iter().enumerate() {
                    let left = (r + world - 1) % world;
                    let want: Vec<u8> = (0..len).map(|i| (i * 7 + left * 31) as u8).collect();
                    assert_eq!(into, want, "world {world} len {len} rank {r}");
                }
            }
        }
    }

    #[test]
    fn a_block_of_another_length_is_refused_naming_the_left_neighbour() {
        let results = on_ring(Driver::new(3).sends_first(), |r, link| {
            let len = if r == 0 { 8 } else { 16 };
            let (out, mut into) = (vec![1u8; len], vec![0u8; len]);
            let call = Call { rank: r, world: 3, op: Op::AllgatherBytes, seq: 0 };
            shift(link, call, &out, &mut into)
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
                let plan = ShiftPlan { call, out: &out, into: &mut into, filled: 0 };
                assert_gates_keep_the_rule(&plan, &format!("world {world} rank {rank}"));
            }
        }
    }
}
