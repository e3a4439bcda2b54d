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

use silvic_core::CollectiveError;

use super::element::{Element, as_bytes, elements};
use super::schedule::{self, segment};
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::twoway::{self, Move};
use super::{RIGHTWARD, Scratch, TWO_WAYS, wire_dir};
use crate::frame::{Header, Path};

/// The blocks of an allgather, one per rank, each of a length every rank knows before the
/// frames move (one length for all, or lengths learned first).
pub(super) trait Blocks {
    /// Rank `rank`'s block: whole once it has come in (this rank's own from the start).
    fn block(&self, rank: usize) -> &[u8];
    /// The length rank `rank`'s block has once it is in: what its frames must carry.
    fn expected(&self, rank: usize) -> usize {
        self.block(rank).len()
    }
    /// Room for the next bytes of rank `rank`'s block, `filled` of them in so far; empty once
    /// all are in.
    fn room(&mut self, rank: usize, filled: usize) -> &mut [u8];
}

/// Where one way's incoming frame stands: the frame, and its bytes in so far.
pub(super) type Filling = (usize, usize);

/// Room for the next bytes of incoming frame `j`, which carries rank `rank`'s block, as
/// `filling` records them (started afresh when `j` is a new frame).
pub(super) fn room_for<'b, B: Blocks + ?Sized>(
    blocks: &'b mut B,
    filling: &mut Filling,
    rank: usize,
    j: usize,
) -> &'b mut [u8] {
    if filling.0 != j {
        *filling = (j, 0);
    }
    blocks.room(rank, filling.1)
}

/// One vector per rank, all as long as this rank's: what `allgather_bytes` returns.
impl Blocks for [Vec<u8>] {
    fn block(&self, rank: usize) -> &[u8] {
        &self[rank]
    }
    fn room(&mut self, rank: usize, filled: usize) -> &mut [u8] {
        &mut self[rank][filled..]
    }
}

/// Equal blocks laid end to end in one buffer: the gather path's, kept in [`Scratch`].
pub(super) struct Flat<'a> {
    pub(super) buf: &'a mut [u8],
    pub(super) block: usize,
}

impl Blocks for Flat<'_> {
    fn block(&self, rank: usize) -> &[u8] {
        &self.buf[rank * self.block..][..self.block]
    }
    fn room(&mut self, rank: usize, filled: usize) -> &mut [u8] {
        &mut self.buf[rank * self.block..][filled..self.block]
    }
}

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

/// Allgathers one equal-length block per rank: on return `blocks[r]` holds rank `r`'s block.
/// `blocks[rank]` is this rank's on entry. `total` is the length the frames report.
///
/// Two-way ([`twoway`]): each block travels both ways round the ring at once, so the gather
/// takes `floor(world / 2)` hops; where the link has chord streams, Bruck's rounds instead
/// ([`super::bruck`], `ceil(log2 world)` of them). The same blocks either way.
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
    if link.network().log_depth() {
        return super::bruck::bruck_gather(link, call, total, blocks);
    }
    gather(link, call, total, blocks)
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

/// An allreduce by gathering: every rank's whole buffer gathered by `rounds` (the two-way
/// gather's, or Bruck's), then each element folded in fold order on every rank.
pub(super) fn gathered_allreduce<T: Element, C: Fn(T, T) -> T>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
    rounds: impl FnOnce(&mut dyn Link, u64, &mut Flat<'_>) -> Result<(), CollectiveError>,
) -> Result<(), CollectiveError> {
    let Call { rank, world, .. } = call;
    let mine = as_bytes(buf);
    let block = mine.len();
    // Every block is written before it is read, so what the buffer held before does not matter.
    scratch.gathered.resize(world * block, 0);
    let gathered = &mut scratch.gathered[..];
    gathered[rank * block..(rank + 1) * block].copy_from_slice(mine);
    rounds(link, block as u64, &mut Flat { buf: gathered, block })?;
    fold_gathered(buf, world, gathered, block, combine);
    Ok(())
}

/// Folds the whole buffers of a world of `world`, gathered end to end in `gathered` (`block`
/// bytes each, rank by rank), into `buf`, element by element in fold order: what every path
/// that gathers raw contributions does once they are in, so all of them give the same bits.
pub(crate) fn fold_gathered<T: Element, C: Fn(T, T) -> T>(
    buf: &mut [T],
    world: usize,
    gathered: &[u8],
    block: usize,
    combine: C,
) {
    // Segment by segment, rank by rank in fold order: each element sees the same sequence of
    // combines as one folded alone would, while the inner loop runs straight over memory.
    let len = buf.len();
    for j in 0..world {
        let seg = segment(len, world, j);
        if seg.is_empty() {
            continue; // a buffer shorter than the world: segments past its end hold nothing
        }
        let width = size_of::<T>();
        let bytes = seg.start * width..seg.end * width;
        let out = &mut buf[seg];
        let mut order = schedule::fold_order(j, world);
        let first = order.next().expect("a world has a rank");
        let values = |r: usize| elements::<T>(&gathered[r * block..][bytes.clone()]);
        for (o, v) in out.iter_mut().zip(values(first)) {
            *o = v;
        }
        for r in order {
            for (o, v) in out.iter_mut().zip(values(r)) {
                *o = combine(*o, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
