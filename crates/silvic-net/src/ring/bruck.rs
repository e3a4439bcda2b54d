//! The Bruck allgather: every rank's block reaches every rank in `ceil(log2 n)` rounds, and the
//! allreduce path made of it for tiny buffers (the raw buffers gathered, then folded locally in
//! fold order, exactly as the gather path does).
//!
//! Round `k` is way `k`, [`route`]`(k)`: a rank sends to `rank - 2^k` and receives from
//! `rank + 2^k`. Before round `k` rank `r` holds the blocks `r, r + 1, …, r + 2^k - 1` (mod
//! `n`); in round `k` it sends them in that order and receives `r + 2^k, …, r + 2^(k+1) - 1`
//! from `r + 2^k`, who holds exactly those. The last round of a world that is not a power of two
//! sends only the `n - 2^k` blocks its receiver still lacks ([`gather_frames`]).
//!
//! Invariants:
//! - **Gates.** Frame `i` of round `k` sends block `r + i`, which came in as frame `i - 2^m` of
//!   round `m = floor(log2 i)`, an earlier round (or is this rank's own, `i = 0`): it waits for
//!   that frame alone, so the gates keep the seam's rule. Every block is written once, into its
//!   own place, and sent only once it is in, so the receive gates are always open and nothing a
//!   frame on its way out reads is ever overwritten.
//! - **Headers.** A frame names the block it carries; a rank receives each block once, so a frame
//!   of another round (or one that overtook another) fails its header check.
//! - **Streams.** The rounds' offsets `-2^k`, `k < ceil(log2 n)`, differ modulo `n` (any two
//!   differ by less than `n`), so no two ways of one plan write to, or read from, the same peer.
//! - **Bits.** The allreduce folds the gathered raw buffers with the gather path's own fold
//!   ([`super::shared::fold_gathered`]), so it gives the gather path's bits, the oracle's.
//! - **Memory.** The allreduce holds `n × S` in [`Scratch`], as the gather path does: it is for
//!   tiny buffers only.

use silvic_core::CollectiveError;

use super::element::Element;
pub(crate) use super::log_depth::rounds;
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::shared::{Blocks, Scratch, gathered_allreduce, room_for};
use crate::frame::{Dir, Header, Path};

/// The route of round `k`: to `rank - 2^k`, from `rank + 2^k`.
pub(crate) fn route(k: usize) -> Route {
    Route { offset: -(1isize << k) }
}

/// Frames of round `k` of the allgather: the `2^k` blocks a rank holds, or in the last round of
/// a world that is not a power of two the `world - 2^k` its receiver still lacks.
pub(crate) fn gather_frames(world: usize, k: usize) -> usize {
    (1 << k).min(world - (1 << k))
}

/// Frame `i` of round `k` at `rank`: the block it sends and the block it receives.
pub(crate) fn gather_move(rank: usize, world: usize, k: usize, i: usize) -> (usize, usize) {
    ((rank + i) % world, (rank + (1 << k) + i) % world)
}

/// Where block `rank + i` came in at `rank`: `None` for its own (`i = 0`), else the round and
/// the frame of that round.
pub(crate) fn gather_arrival(i: usize) -> Option<(usize, usize)> {
    let k = i.checked_ilog2()? as usize;
    Some((k, i - (1 << k)))
}

/// The routes of the rounds of a world of `world`, in order.
pub(crate) fn routes(world: usize) -> impl Iterator<Item = Route> {
    (0..rounds(world)).map(route)
}

/// The Bruck allgather as a plan (see the module doc).
pub(super) struct BruckPlan<'b, B: ?Sized> {
    call: Call,
    header: Header,
    routes: Vec<Route>,
    blocks: &'b mut B,
    /// Per way: the frame being received and how many of its bytes are in.
    filling: Vec<(usize, usize)>,
}

impl<'b, B: Blocks + ?Sized> BruckPlan<'b, B> {
    /// The allgather of `blocks` for `call`, whose frames report `total`.
    pub(super) fn new(call: Call, total: u64, blocks: &'b mut B) -> Self {
        let routes: Vec<Route> = routes(call.world).collect();
        let filling = vec![(0, 0); routes.len()];
        let header = Header::data(call.op, call.seq, total, 0).on(Path::Bruck);
        BruckPlan { call, header, routes, blocks, filling }
    }

    fn moves(&self, way: usize, i: usize) -> (usize, usize) {
        gather_move(self.call.rank, self.call.world, way, i)
    }

    /// The block frame `i` of `way` sends (`out`) or receives, for the tests' checks.
    #[cfg(test)]
    pub(super) fn block_of(&self, way: usize, i: usize, out: bool) -> usize {
        let (send, recv) = self.moves(way, i);
        if out { send } else { recv }
    }
}

impl<B: Blocks + ?Sized> FramePlan for BruckPlan<'_, B> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &self.routes
    }
    fn frames(&self, way: usize) -> usize {
        gather_frames(self.call.world, way)
    }
    fn header(&self, way: usize, i: usize) -> Header {
        let send = self.moves(way, i).0;
        let len = self.blocks.expected(send) as u64;
        Header { len, ..self.header.carrying(Dir::Right, send) }
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        let recv = self.moves(way, j).1;
        let len = self.blocks.expected(recv) as u64;
        Header { len, ..self.header.carrying(Dir::Right, recv) }
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        match gather_arrival(progress.sent[way]) {
            None => true,
            Some((round, frame)) => progress.received[round] > frame,
        }
    }
    fn may_receive(&self, _: usize, _: Moved<'_>) -> bool {
        true
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        self.blocks.block(self.moves(way, i).0)
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        let recv = self.moves(way, j).1;
        room_for(self.blocks, &mut self.filling[way], recv, j)
    }
    fn commit(&mut self, way: usize, _: usize, n: usize) {
        self.filling[way].1 += n;
    }
}

/// The Bruck allgather over any [`Blocks`].
pub(super) fn bruck_gather<B: Blocks + ?Sized>(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    blocks: &mut B,
) -> Result<(), CollectiveError> {
    link.run(&mut BruckPlan::new(call, total, blocks))
}

/// The allreduce for tiny buffers: every rank's whole buffer gathered by Bruck's rounds, then
/// each element folded in fold order, exactly as [`super::gather::gather_allreduce`] folds.
pub(crate) fn bruck_allreduce<T: Element, C: Fn(T, T) -> T>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    gathered_allreduce(link, call, buf, combine, scratch, |link, total, blocks| {
        bruck_gather(link, call, total, blocks)
    })
}

#[cfg(test)]
#[path = "bruck_tests.rs"]
mod tests;
