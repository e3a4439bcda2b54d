//! What the plans share: the two ways round the ring, the memory a ring keeps between calls
//! ([`Scratch`]), the blocks an allgather fills ([`Blocks`]), and the allreduce made of a
//! gather of whole buffers and a local fold in fold order ([`gathered_allreduce`],
//! [`fold_gathered`]), which the gather path and Bruck's both are.
//!
//! Invariants: [`fold_gathered`] folds every element over the ranks in
//! [`schedule::fold_order`] of its segment, the order the ring path's reduce-scatter folds in,
//! so every path that gathers raw buffers gives the ring path's bits. Nothing here names a
//! plan: the plans import this file, never each other for what it holds.

use silvic_core::CollectiveError;

use super::element::{Element, as_bytes, elements};
use super::schedule::{self, segment};
use super::seam::{Call, Link, Route};
use crate::frame::Dir;

/// The two ways of the plans round the ring (the gather's, the ring path's, the records'): way [`RIGHTWARD`] to the right neighbour, then way [`LEFTWARD`].
/// A gate of the leftward way may look at the rightward way, never the other way round (the
/// seam's rule).
pub(super) const TWO_WAYS: [Route; 2] = [Route::RIGHTWARD, Route::LEFTWARD];
pub(super) const RIGHTWARD: usize = 0;
pub(super) const LEFTWARD: usize = 1;

/// The direction a frame of `way` (of [`TWO_WAYS`]) names in its header.
pub(super) fn wire_dir(way: usize) -> Dir {
    match way {
        RIGHTWARD => Dir::Right,
        _ => Dir::Left,
    }
}

/// Reusable memory of a ring, kept between calls so steady-state collectives do not allocate.
///
/// It grows to the largest call seen and stays there: `fold` is the ring path's fold scratch,
/// and `gathered` holds the gather path's `world × bytes`, at most
/// `max(GATHER_MAX_BYTES, world × 4 KiB)` (`super::choice::GATHER_MAX_BYTES`).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub(super) fold: Vec<u8>,
    pub(super) gathered: Vec<u8>,
}

/// Bytes of received data folded at a time, in [`Scratch`]'s `fold`. Small enough to stay in
/// cache, large enough that a read moves plenty per system call.
pub(super) const FOLD_SCRATCH: usize = 128 * 1024;

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
