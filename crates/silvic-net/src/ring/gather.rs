//! The gather plan: the two-way allgather ([`super::twoway`]) of blocks whose lengths every
//! rank knows before the frames move (equal, or learned first: [`super::varlen`]) as a
//! [`FramePlan`], and the two calls made of it here: `allgather_bytes`, and the allreduce's
//! gather path (every rank's whole buffer gathered, then each element folded in fold order).
//!
//! Invariants: hop `h` of a way is its frame `h` and forwards the block that way's frame `h - 1`
//! brought, so a block moves on the moment it is in; every block is written once and sent only
//! once it is in, so frames come in whenever they arrive (the receive gates are always open).
//! The fold visits every segment's ranks in [`schedule::fold_order`], the order the ring path's
//! reduce-scatter folds in, so either path gives the same bits.
//!
//! [`schedule::fold_order`]: super::schedule::fold_order

use silvic_core::CollectiveError;

use super::element::Element;
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::shared::{Blocks, RIGHTWARD, Scratch, TWO_WAYS, gathered_allreduce, room_for, wire_dir};
use super::twoway::{self, Move};
use crate::frame::{Header, Path};

/// The two-way gather as a plan (see the module doc): way [`RIGHTWARD`] runs
/// [`twoway::hops`] frames, the leftward way [`twoway::left_hops`].
struct GatherPlan<'b, B: ?Sized> {
    call: Call,
    header: Header,
    blocks: &'b mut B,
    /// Per way: the frame being received and how many of its bytes are in.
    filling: [(usize, usize); 2],
}

impl<B: Blocks + ?Sized> GatherPlan<'_, B> {
    fn moves(&self, way: usize, i: usize) -> Move {
        let hop = twoway::hop(self.call.rank, self.call.world, i);
        match way {
            RIGHTWARD => hop.right,
            _ => hop.left.expect("a leftward hop within the leftward frames"),
        }
    }
}

impl<B: Blocks + ?Sized> FramePlan for GatherPlan<'_, B> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &TWO_WAYS
    }
    fn frames(&self, way: usize) -> usize {
        match way {
            RIGHTWARD => twoway::hops(self.call.world),
            _ => twoway::left_hops(self.call.world),
        }
    }
    fn header(&self, way: usize, i: usize) -> Header {
        let send = self.moves(way, i).send;
        let len = self.blocks.expected(send) as u64;
        Header { len, ..self.header.carrying(wire_dir(way), send) }
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        let recv = self.moves(way, j).recv;
        let len = self.blocks.expected(recv) as u64;
        Header { len, ..self.header.carrying(wire_dir(way), recv) }
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        progress.received[way] >= progress.sent[way]
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        self.blocks.block(self.moves(way, i).send)
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        let recv = self.moves(way, j).recv;
        room_for(self.blocks, &mut self.filling[way], recv, j)
    }
    fn commit(&mut self, way: usize, _: usize, n: usize) {
        self.filling[way].1 += n;
    }
}

/// The two-way allgather over any [`Blocks`]: each frame carries its block's
/// [`Blocks::expected`] length, and `total` in its header.
pub(super) fn gather<B: Blocks + ?Sized>(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    blocks: &mut B,
) -> Result<(), CollectiveError> {
    gather_of(Path::Gather, link, call, total, blocks)
}

/// [`gather`] as the last step of a call on `path`, whose every frame names that path (a
/// receiver refuses a frame of another path in the same call: `link/control.rs`).
pub(super) fn gather_of<B: Blocks + ?Sized>(
    path: Path,
    link: &mut dyn Link,
    call: Call,
    total: u64,
    blocks: &mut B,
) -> Result<(), CollectiveError> {
    let header = Header::data(call.op, call.seq, total, 0).on(path);
    link.run(&mut GatherPlan { call, header, blocks, filling: [(0, 0); 2] })
}

/// The gather path: gather every rank's whole buffer, then fold each element in fold order.
pub(crate) fn gather_allreduce<T: Element, C: Fn(T, T) -> T>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    gathered_allreduce(link, call, buf, combine, scratch, |link, total, blocks| {
        gather(link, call, total, blocks)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::allgather;
    use crate::ring::mem::{Driver, on_ring};
    use silvic_core::Op;

    #[test]
    fn allgather_delivers_every_block_in_half_the_world_of_hops() {
        for world in 1..=16 {
            for block in [0, 1, 5, 4096] {
                let results = on_ring(Driver::new(world), |r, link| {
                    let mut blocks = vec![Vec::new(); world];
                    blocks[r] = (0..block).map(|i| (i * 31 + r * 7) as u8).collect();
                    let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 3 };
                    allgather(link, call, block as u64, &mut blocks).unwrap();
                    (blocks, link.sent.clone())
                });
                for (blocks, sent) in results {
                    // floor(world / 2) hops: rightward every hop, leftward all but the last of
                    // an even world.
                    assert_eq!(sent, [world / 2, (world - 1) / 2], "world {world}");
                    for (r, b) in blocks.iter().enumerate() {
                        let sent: Vec<u8> = (0..block).map(|i| (i * 31 + r * 7) as u8).collect();
                        assert_eq!(b, &sent, "world {world} block {block} rank {r}");
                    }
                }
            }
        }
    }

    /// The gather plan keeps the seam's rule: a gate of frame `i` of way `w` opens with nothing
    /// of way `w` from frame `i` on, and nothing of a later way.
    #[test]
    fn gather_gates_look_only_at_earlier_frames_and_ways() {
        for world in 1..=16 {
            for rank in 0..world {
                let mut blocks = vec![Vec::new(); world];
                let call = Call { rank, world, op: Op::AllgatherBytes, seq: 0 };
                let header = Header::data(call.op, 0, 0, 0);
                let plan =
                    GatherPlan { call, header, blocks: &mut blocks[..], filling: [(0, 0); 2] };
                crate::ring::oracle::assert_gates_keep_the_rule(&plan, &format!("world {world}"));
            }
        }
    }
}
