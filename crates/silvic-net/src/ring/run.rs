//! Executes the ring schedule over a [`Link`]: the allreduce paths and the allgather, each a
//! [`Plan`] of frames that the link moves as soon as the plan lets it.

use silvic_core::{CollectiveError, Op};

use std::ops::Range;

use super::schedule::{self, pass, segment};
use super::twoway::{self, Move};
use crate::frame::{Dir, Header};

/// Bytes of received data folded at a time. Small enough to stay in cache, large enough that a
/// read moves plenty per system call.
const FOLD_SCRATCH: usize = 128 * 1024;

/// Where the payload of a received frame goes, as it arrives.
pub(crate) trait Sink {
    /// Room for the next bytes; empty once the whole payload has arrived.
    fn space(&mut self) -> &mut [u8];
    /// `n` bytes were written to the front of [`Sink::space`].
    fn commit(&mut self, n: usize);
}

/// A collective as the frames it moves, each way round the ring: on [`Dir::Right`] a rank sends
/// frames to its right neighbour and receives as many from its left, on [`Dir::Left`] the
/// mirror. Frames go out in order and come in in order, each way on its own.
///
/// A frame goes out once the frames it forwards are in ([`Plan::ready`]), and one comes in once
/// the frames that sent what it overwrites are out ([`Plan::may_receive`]), so a link can move
/// every frame the moment it may: a rank forwards a block as soon as it has it, while the next
/// one arrives. A gate may look at both ways (the ring path's leftward frames forward what the
/// rightward reduce-scatter folded), but never at the frame itself or a later one of its own
/// way. Every rank builds the same plan from the call alone.
pub(crate) trait Plan {
    /// The call the plan carries out.
    fn call(&self) -> Call;
    /// Frames sent (and as many received) on `dir`.
    fn frames(&self, dir: Dir) -> usize;
    /// The header of outgoing frame `i` on `dir`.
    fn header(&self, dir: Dir, i: usize) -> Header;
    /// What the header of incoming frame `j` on `dir` must equal (checked before a payload byte
    /// is taken).
    fn expect(&self, dir: Dir, j: usize) -> Header;
    /// Whether the next outgoing frame on `dir` (frame `moved.sent(dir)`) may go.
    fn ready(&self, dir: Dir, moved: Moved) -> bool;
    /// Whether the next incoming frame on `dir` (frame `moved.received(dir)`) may be taken.
    fn may_receive(&self, dir: Dir, moved: Moved) -> bool;
    /// The payload of outgoing frame `i`; asked for only once it is ready.
    fn payload(&self, dir: Dir, i: usize) -> &[u8];
    /// Room for the next payload bytes of incoming frame `j`; empty once it is all in.
    fn space(&mut self, dir: Dir, j: usize) -> &mut [u8];
    /// `n` bytes of incoming frame `j` were written to the front of [`Plan::space`].
    fn commit(&mut self, dir: Dir, j: usize, n: usize);
}

/// How far a link has moved a plan: per way, the frames all out and the frames all in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Indexed by [`way`]: rightward, leftward.
    pub(crate) sent: [usize; 2],
    pub(crate) received: [usize; 2],
}

impl Moved {
    pub(crate) fn sent(&self, dir: Dir) -> usize {
        self.sent[way(dir)]
    }
    pub(crate) fn received(&self, dir: Dir) -> usize {
        self.received[way(dir)]
    }
}

/// A connection to both ring neighbours.
pub(crate) trait Link {
    /// Moves every frame of `plan`, each as soon as the plan lets it, writing and reading at the
    /// same time; returns once all are through.
    fn run(&mut self, plan: &mut dyn Plan) -> Result<(), CollectiveError>;
}

/// Incoming frame `frame` on `dir` of a plan, as a [`Sink`] for a frame reader.
pub(crate) struct Receiving<'p> {
    pub(crate) plan: &'p mut dyn Plan,
    pub(crate) dir: Dir,
    pub(crate) frame: usize,
}

impl Sink for Receiving<'_> {
    fn space(&mut self) -> &mut [u8] {
        self.plan.space(self.dir, self.frame)
    }
    fn commit(&mut self, n: usize) {
        self.plan.commit(self.dir, self.frame, n);
    }
}

/// A number type the ring reduces. Payloads carry its little-endian bytes.
pub(crate) trait Element: bytemuck::Pod {
    fn from_le(bytes: [u8; 8]) -> Self;
}

impl Element for f64 {
    fn from_le(bytes: [u8; 8]) -> Self {
        f64::from_le_bytes(bytes)
    }
}

impl Element for i64 {
    fn from_le(bytes: [u8; 8]) -> Self {
        i64::from_le_bytes(bytes)
    }
}

/// Which collective call a plan belongs to, as this rank sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) op: Op,
    pub(crate) seq: u64,
}

/// Reusable memory of a ring, kept between calls so steady-state collectives do not allocate.
///
/// It grows to the largest call seen and stays there: `fold` is [`FOLD_SCRATCH`] bytes, and
/// `gathered` holds the gather path's `world × bytes`, at most
/// `max(GATHER_MAX_BYTES, world × 4 KiB)` ([`schedule::GATHER_MAX_BYTES`]).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    fold: Vec<u8>,
    gathered: Vec<u8>,
}

/// The blocks of an allgather, one per rank, all of one length.
trait Blocks {
    fn block(&self, rank: usize) -> &[u8];
    fn block_mut(&mut self, rank: usize) -> &mut [u8];
}

/// One vector per rank, all as long as this rank's: what `allgather_bytes` returns.
impl Blocks for [Vec<u8>] {
    fn block(&self, rank: usize) -> &[u8] {
        &self[rank]
    }
    fn block_mut(&mut self, rank: usize) -> &mut [u8] {
        &mut self[rank]
    }
}

/// Equal blocks laid end to end in one buffer: the gather path's, kept in [`Scratch`].
struct Flat<'a> {
    buf: &'a mut [u8],
    block: usize,
}

impl Blocks for Flat<'_> {
    fn block(&self, rank: usize) -> &[u8] {
        &self.buf[rank * self.block..][..self.block]
    }
    fn block_mut(&mut self, rank: usize) -> &mut [u8] {
        &mut self.buf[rank * self.block..][..self.block]
    }
}

/// The slot of `dir` in per-way arrays.
pub(crate) fn way(dir: Dir) -> usize {
    match dir {
        Dir::Right => 0,
        Dir::Left => 1,
    }
}

/// The two-way gather ([`twoway`]) as a plan: hop `h` of a way is its frame `h`, and it
/// forwards the block that way's frame `h - 1` brought, so a block moves on the moment it is in.
/// Every block is written once and sent only once it is in, so frames come in whenever they
/// arrive.
struct GatherPlan<'b, B: ?Sized> {
    call: Call,
    header: Header,
    blocks: &'b mut B,
    /// Per way: the frame being received and how many of its bytes are in.
    filling: [(usize, usize); 2],
}

impl<B: Blocks + ?Sized> GatherPlan<'_, B> {
    fn moves(&self, dir: Dir, i: usize) -> Move {
        let hop = twoway::hop(self.call.rank, self.call.world, i);
        match dir {
            Dir::Right => hop.right,
            Dir::Left => hop.left.expect("a leftward hop within the leftward frames"),
        }
    }
}

impl<B: Blocks + ?Sized> Plan for GatherPlan<'_, B> {
    fn call(&self) -> Call {
        self.call
    }
    fn frames(&self, dir: Dir) -> usize {
        match dir {
            Dir::Right => twoway::hops(self.call.world),
            Dir::Left => twoway::left_hops(self.call.world),
        }
    }
    fn header(&self, dir: Dir, i: usize) -> Header {
        self.header.carrying(dir, self.moves(dir, i).send)
    }
    fn expect(&self, dir: Dir, j: usize) -> Header {
        self.header.carrying(dir, self.moves(dir, j).recv)
    }
    fn ready(&self, dir: Dir, moved: Moved) -> bool {
        moved.received(dir) >= moved.sent(dir)
    }
    fn may_receive(&self, _: Dir, _: Moved) -> bool {
        true
    }
    fn payload(&self, dir: Dir, i: usize) -> &[u8] {
        self.blocks.block(self.moves(dir, i).send)
    }
    fn space(&mut self, dir: Dir, j: usize) -> &mut [u8] {
        let recv = self.moves(dir, j).recv;
        let filling = &mut self.filling[way(dir)];
        if filling.0 != j {
            *filling = (j, 0);
        }
        let filled = filling.1;
        &mut self.blocks.block_mut(recv)[filled..]
    }
    fn commit(&mut self, dir: Dir, _: usize, n: usize) {
        self.filling[way(dir)].1 += n;
    }
}

/// Allgathers one equal-length block per rank: on return `blocks[r]` holds rank `r`'s block.
/// `blocks[rank]` is this rank's on entry. `total` is the length the frames report.
///
/// Two-way ([`twoway`]): each block travels both ways round the ring at once, so the gather
/// takes `floor(world / 2)` hops.
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
    gather(link, call, total, block, blocks)
}

/// The two-way allgather over any [`Blocks`] of `block` bytes each.
fn gather<B: Blocks + ?Sized>(
    link: &mut dyn Link,
    call: Call,
    total: u64,
    block: usize,
    blocks: &mut B,
) -> Result<(), CollectiveError> {
    let header = Header::data(call.op, call.seq, total, block as u64);
    link.run(&mut GatherPlan { call, header, blocks, filling: [(0, 0); 2] })
}

/// Replaces `buf` with its reduction over the ring, `combine` folding in fold order.
pub(crate) fn allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    if schedule::uses_gather(std::mem::size_of_val(buf), call.world) {
        small_allreduce(link, call, buf, combine, scratch)
    } else {
        ring_allreduce(link, call, buf, combine, scratch)
    }
}

/// The gather path: gather every rank's whole buffer, then fold each element in fold order.
fn small_allreduce<T: Element, C: Fn(T, T) -> T>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let Call { rank, world, .. } = call;
    let mine: &[u8] = bytemuck::cast_slice(buf);
    let block = mine.len();
    // Every block is written before it is read, so what the buffer held before does not matter.
    scratch.gathered.resize(world * block, 0);
    let gathered = &mut scratch.gathered[..];
    gathered[rank * block..(rank + 1) * block].copy_from_slice(mine);
    gather(link, call, block as u64, block, &mut Flat { buf: gathered, block })?;
    // Segment by segment, rank by rank in fold order: each element sees the same sequence of
    // combines as one folded alone would, while the inner loop runs straight over memory.
    let len = buf.len();
    for j in 0..world {
        let seg = segment(len, world, j);
        let bytes = seg.start * 8..seg.end * 8;
        let out = &mut buf[seg];
        let mut order = schedule::fold_order(j, world);
        let first = order.next().expect("a world has a rank");
        let values = |r: usize| gathered[r * block..][bytes.clone()].chunks_exact(8);
        for (o, v) in out.iter_mut().zip(values(first)) {
            *o = T::from_le(v.try_into().expect("chunks of 8"));
        }
        for r in order {
            for (o, v) in out.iter_mut().zip(values(r)) {
                *o = combine(*o, T::from_le(v.try_into().expect("chunks of 8")));
            }
        }
    }
    Ok(())
}

/// The ring path as a plan: a reduce-scatter rightward round the ring, after which this rank
/// owns segment `rank + 1` folded over every rank, then an allgather of the owned segments.
/// When each segment is one slice (the sizes whose time is hops), the allgather runs both ways
/// round the ring at once ([`twoway`], with segment `b + 1` as rank `b`'s block): `world - 1 +
/// floor(world / 2)` hops instead of the `2(world - 1)` of a one-way ring, with the same bytes.
/// Sliced segments are gathered rightward ([`RingPlan::two_way`]).
///
/// Each segment is cut into `count` slices ([`schedule::slices`]). Slice `k` makes its
/// reduce-scatter steps and rightward gather steps as consecutive rightward frames, and its
/// leftward hops (if any) as consecutive leftward frames, so slice `k + 1` sets off while slice
/// `k` is still on its way round. A frame forwards what the way's frame before it brought
/// (folded, in the reduce-scatter); the first of a slice sends this rank's own values, and the
/// first leftward one this rank's owned segment once the reduce-scatter has folded it. Each
/// element still meets the ranks in its segment's fold order.
///
/// Nothing is overwritten before it is sent:
/// - Rightward, a rank takes in at most one frame more than it has sent: frame `j` comes in once
///   frame `j - 1` is out. Step `s` of the reduce-scatter sends segment `rank - s` and receives
///   segment `rank - s - 1`, and hop `h` of the rightward gather overwrites segment `rank - h`,
///   which the reduce-scatter sent at step `h`, long before. The credit also keeps the ring in
///   step without a barrier (the socket buffers hold what a neighbour sends beyond it; reading
///   further ahead made the ring slower, docs/performance.md).
/// - Leftward hop `h` overwrites segment `rank + h + 2`, which the reduce-scatter sent at step
///   `world - h - 2`: it comes in once that rightward frame is out. An honest right neighbour
///   cannot send it earlier (the segment was folded on its way through this rank), so the gate
///   only guards the buffer against a peer that does.
/// - The two ways carry different segments, and no way sends what the other overwrites.
struct RingPlan<'a, T, C> {
    call: Call,
    buf: &'a mut [T],
    combine: C,
    count: usize,
    scratch: &'a mut [u8],
    /// Per way, the frame being received.
    filling: [Filling; 2],
}

/// Where an incoming frame of one way stands: the frame, its bytes in so far, and how many of
/// them wait in the fold scratch to be folded (fewer than one element once folded).
#[derive(Debug, Clone, Copy)]
struct Filling {
    frame: usize,
    bytes: usize,
    pending: usize,
}

impl Filling {
    const NONE: Filling = Filling { frame: usize::MAX, bytes: 0, pending: 0 };
}

/// What one frame of the ring path moves: the slice, the segments sent and received, and
/// whether what comes in is folded (the reduce-scatter) rather than copied.
#[derive(Debug, Clone, Copy)]
struct RingFrame {
    slice: usize,
    send: usize,
    recv: usize,
    folds: bool,
    /// Its index among the slice's frames on its way.
    at: usize,
}

impl<T: Element, C: Fn(T, T) -> T> RingPlan<'_, T, C> {
    /// Whether the reduced segments are gathered both ways: when each segment is one slice.
    /// Sliced segments are gathered rightward only, step by step behind the reduce-scatter: their
    /// time is the bytes, not the hops, and gathering them both ways made world 4 slower at 2 and
    /// 16 MiB on loopback (docs/performance.md, "Fewer hops").
    fn two_way(&self) -> bool {
        self.count == 1
    }

    /// Frames per slice on `dir`.
    fn per_slice(&self, dir: Dir) -> usize {
        let world = self.call.world;
        match (dir, self.two_way()) {
            (Dir::Right, true) => world - 1 + twoway::hops(world),
            (Dir::Right, false) => 2 * (world - 1),
            (Dir::Left, true) => twoway::left_hops(world),
            (Dir::Left, false) => 0,
        }
    }

    /// What frame `i` on `dir` moves.
    fn frame(&self, dir: Dir, i: usize) -> RingFrame {
        let Call { rank, world, .. } = self.call;
        let per = self.per_slice(dir);
        let (at, slice) = (i % per, i / per);
        // The gather moves owned segments: rank `b` owns segment `b + 1`.
        let owned = |m: Move| ((m.send + 1) % world, (m.recv + 1) % world);
        let ((send, recv), folds) = match dir {
            Dir::Right if at < world - 1 => {
                let p = pass(rank, world, at, 0);
                ((p.send, p.recv), true)
            }
            Dir::Right if self.two_way() => {
                (owned(twoway::hop(rank, world, at + 1 - world).right), false)
            }
            Dir::Right => {
                let p = pass(rank, world, at + 1 - world, 1);
                ((p.send, p.recv), false)
            }
            Dir::Left => {
                let hop = twoway::hop(rank, world, at).left;
                (owned(hop.expect("a leftward hop within the leftward frames")), false)
            }
        };
        RingFrame { slice, send, recv, folds, at }
    }

    fn slice(&self, seg: usize, k: usize) -> Range<usize> {
        schedule::slice(self.buf.len(), self.call.world, seg, self.count, k)
    }

    fn frame_header(&self, dir: Dir, seg: usize, k: usize) -> Header {
        let total = std::mem::size_of_val(self.buf) as u64;
        let len = (self.slice(seg, k).len() * 8) as u64;
        Header::data(self.call.op, self.call.seq, total, len).carrying(dir, seg)
    }
}

impl<T: Element, C: Fn(T, T) -> T> Plan for RingPlan<'_, T, C> {
    fn call(&self) -> Call {
        self.call
    }
    fn frames(&self, dir: Dir) -> usize {
        self.per_slice(dir) * self.count
    }
    fn header(&self, dir: Dir, i: usize) -> Header {
        let f = self.frame(dir, i);
        self.frame_header(dir, f.send, f.slice)
    }
    fn expect(&self, dir: Dir, j: usize) -> Header {
        let f = self.frame(dir, j);
        self.frame_header(dir, f.recv, f.slice)
    }
    fn ready(&self, dir: Dir, moved: Moved) -> bool {
        let i = moved.sent(dir);
        let f = self.frame(dir, i);
        match dir {
            Dir::Right => f.at == 0 || moved.received(Dir::Right) >= i,
            // The owned segment is whole once the slice's last reduce-scatter frame is in.
            Dir::Left if f.at == 0 => {
                let folded = f.slice * self.per_slice(Dir::Right) + self.call.world - 1;
                moved.received(Dir::Right) >= folded
            }
            Dir::Left => moved.received(Dir::Left) >= i,
        }
    }
    fn may_receive(&self, dir: Dir, moved: Moved) -> bool {
        let j = moved.received(dir);
        match dir {
            Dir::Right => j <= moved.sent(Dir::Right),
            Dir::Left => {
                let f = self.frame(dir, j);
                let step = self.call.world - f.at - 2;
                moved.sent(Dir::Right) > f.slice * self.per_slice(Dir::Right) + step
            }
        }
    }
    fn payload(&self, dir: Dir, i: usize) -> &[u8] {
        let f = self.frame(dir, i);
        bytemuck::cast_slice(&self.buf[self.slice(f.send, f.slice)])
    }
    fn space(&mut self, dir: Dir, j: usize) -> &mut [u8] {
        let filling = self.filling[way(dir)];
        let filling =
            if filling.frame == j { filling } else { Filling { frame: j, ..Filling::NONE } };
        self.filling[way(dir)] = filling;
        let f = self.frame(dir, j);
        let dst = self.slice(f.recv, f.slice);
        if !f.folds {
            return &mut bytemuck::cast_slice_mut(&mut self.buf[dst])[filling.bytes..];
        }
        let left = dst.len() * 8 - filling.bytes;
        let room = (self.scratch.len() - filling.pending).min(left);
        &mut self.scratch[filling.pending..filling.pending + room]
    }
    fn commit(&mut self, dir: Dir, j: usize, n: usize) {
        let f = self.frame(dir, j);
        let dst = self.slice(f.recv, f.slice);
        let filling = &mut self.filling[way(dir)];
        if !f.folds {
            filling.bytes += n;
            return;
        }
        // dst[i] = combine(received[i], dst[i]): the received value is the earlier accumulator.
        let done = (filling.bytes - filling.pending) / 8;
        filling.bytes += n;
        filling.pending += n;
        let whole = filling.pending / 8;
        let pending = filling.pending;
        filling.pending -= whole * 8;
        let dst = &mut self.buf[dst][done..done + whole];
        for (d, chunk) in dst.iter_mut().zip(self.scratch[..whole * 8].chunks_exact(8)) {
            let acc = T::from_le(chunk.try_into().expect("chunks of 8"));
            *d = (self.combine)(acc, *d);
        }
        self.scratch.copy_within(whole * 8..pending, 0);
    }
}

/// The ring path: [`RingPlan`] over the link.
pub(crate) fn ring_allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    let count = schedule::slices(buf.len(), call.world, std::mem::size_of::<T>());
    scratch.fold.resize(FOLD_SCRATCH, 0);
    let mut plan = RingPlan {
        call,
        buf,
        combine,
        count,
        scratch: &mut scratch.fold,
        filling: [Filling::NONE; 2],
    };
    link.run(&mut plan)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;
    use crate::ring::schedule::segment_of;
    use silvic_core::fold;
    use std::collections::VecDeque;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    /// How long an in-memory rank may see no frame move before its call fails: far beyond any
    /// step of these tests, so only a plan whose gates wait in a circle reaches it.
    const STALL: Duration = Duration::from_secs(20);

    /// A frame slot between two neighbours, one way: one frame at a time, its memory kept, so
    /// a link of these allocates nothing once the slots have grown to the largest frame.
    #[derive(Default)]
    struct Mailbox {
        slot: Mutex<Slot>,
    }

    #[derive(Default)]
    struct Slot {
        frame: Vec<u8>,
        full: bool,
        /// A rank at either end has left its link: an empty slot stays empty.
        closed: bool,
    }

    /// Counts every change of any slot of a ring, so an idle rank sleeps until one.
    #[derive(Default)]
    struct Ticks {
        count: Mutex<u64>,
        changed: Condvar,
    }

    impl Ticks {
        fn now(&self) -> u64 {
            *self.count.lock().unwrap()
        }
        fn bump(&self) {
            *self.count.lock().unwrap() += 1;
            self.changed.notify_all();
        }
        /// Sleeps until a slot changes after `seen` (or a while has passed).
        fn wait_past(&self, seen: u64) {
            let count = self.count.lock().unwrap();
            let _ =
                self.changed.wait_timeout_while(count, Duration::from_millis(50), |c| *c == seen);
        }
    }

    impl Mailbox {
        fn lock(&self) -> MutexGuard<'_, Slot> {
            self.slot.lock().unwrap()
        }
    }

    /// An in-memory ring neighbour: frames travel through one slot per direction between
    /// neighbours, each moved the moment the plan lets it, and payloads are handed to the plan
    /// in uneven pieces to exercise partial commits.
    pub(crate) struct MemLink {
        /// Frames from the left (travelling rightward) and from the right.
        from_left: Arc<Mailbox>,
        from_right: Arc<Mailbox>,
        /// The right neighbour's `from_left` and the left neighbour's `from_right`.
        right: Arc<Mailbox>,
        left: Arc<Mailbox>,
        ticks: Arc<Ticks>,
        left_rank: usize,
        right_rank: usize,
        piece: usize,
        /// Frames sent each way so far: rightward, leftward.
        pub(crate) sent: [usize; 2],
    }

    pub(crate) fn mem_ring(world: usize) -> Vec<MemLink> {
        let from_left: Vec<Arc<Mailbox>> = (0..world).map(|_| Arc::default()).collect();
        let from_right: Vec<Arc<Mailbox>> = (0..world).map(|_| Arc::default()).collect();
        let ticks = Arc::new(Ticks::default());
        (0..world)
            .map(|r| {
                let (left_rank, right_rank) = ((r + world - 1) % world, (r + 1) % world);
                MemLink {
                    from_left: from_left[r].clone(),
                    from_right: from_right[r].clone(),
                    right: from_left[right_rank].clone(),
                    left: from_right[left_rank].clone(),
                    ticks: ticks.clone(),
                    left_rank,
                    right_rank,
                    piece: 1 + r * 37 % 4099,
                    sent: [0; 2],
                }
            })
            .collect()
    }

    impl MemLink {
        /// Puts outgoing frame `i` on `dir` in the neighbour's slot if it is empty.
        fn try_put(&self, plan: &dyn Plan, dir: Dir, i: usize) -> bool {
            let mailbox = match dir {
                Dir::Right => &self.right,
                Dir::Left => &self.left,
            };
            let mut slot = mailbox.lock();
            if slot.full {
                return false;
            }
            slot.frame.clear();
            slot.frame.extend_from_slice(&plan.header(dir, i).encode());
            slot.frame.extend_from_slice(plan.payload(dir, i));
            slot.full = true;
            drop(slot);
            self.ticks.bump();
            true
        }

        /// Takes incoming frame `j` on `dir` into the plan if it is there.
        fn try_take(
            &self,
            plan: &mut dyn Plan,
            dir: Dir,
            j: usize,
        ) -> Result<bool, CollectiveError> {
            let (mailbox, peer) = match dir {
                Dir::Right => (&self.from_left, self.left_rank),
                Dir::Left => (&self.from_right, self.right_rank),
            };
            let mut slot = mailbox.lock();
            if !slot.full {
                return if slot.closed {
                    Err(CollectiveError::PeerClosed { peer })
                } else {
                    Ok(false)
                };
            }
            let head = Header::decode(slot.frame[..HEADER_LEN].try_into().unwrap()).unwrap();
            head.expect(&plan.expect(dir, j), peer)?;
            let mut sink = Receiving { plan, dir, frame: j };
            let mut rest = &slot.frame[HEADER_LEN..];
            while !rest.is_empty() {
                let space = sink.space();
                let n = space.len().min(self.piece).min(rest.len());
                space[..n].copy_from_slice(&rest[..n]);
                sink.commit(n);
                rest = &rest[n..];
            }
            assert!(sink.space().is_empty(), "payload shorter than the sink");
            slot.full = false;
            drop(slot);
            self.ticks.bump();
            Ok(true)
        }
    }

    impl Drop for MemLink {
        fn drop(&mut self) {
            for mailbox in [&self.from_left, &self.from_right, &self.right, &self.left] {
                mailbox.lock().closed = true;
            }
            self.ticks.bump();
        }
    }

    impl Link for MemLink {
        fn run(&mut self, plan: &mut dyn Plan) -> Result<(), CollectiveError> {
            let mut m = Moved::default();
            let mut moved_at = Instant::now();
            loop {
                let seen = self.ticks.now();
                let mut idle = true;
                for (d, dir) in [Dir::Right, Dir::Left].into_iter().enumerate() {
                    let frames = plan.frames(dir);
                    while m.sent[d] < frames
                        && plan.ready(dir, m)
                        && self.try_put(plan, dir, m.sent[d])
                    {
                        (m.sent[d], idle) = (m.sent[d] + 1, false);
                    }
                    if m.received[d] < frames
                        && plan.may_receive(dir, m)
                        && self.try_take(plan, dir, m.received[d])?
                    {
                        (m.received[d], idle) = (m.received[d] + 1, false);
                    }
                }
                let frames = [plan.frames(Dir::Right), plan.frames(Dir::Left)];
                if m.sent == frames && m.received == frames {
                    break;
                }
                if !idle {
                    moved_at = Instant::now();
                } else if moved_at.elapsed() >= STALL {
                    // Gates that wait in a circle fail the test instead of hanging it.
                    let peer = self.left_rank;
                    return Err(CollectiveError::Timeout { peer, waited: STALL });
                } else {
                    self.ticks.wait_past(seen);
                }
            }
            self.sent = [self.sent[0] + m.sent[0], self.sent[1] + m.sent[1]];
            Ok(())
        }
    }

    /// Runs `f` on every rank of an in-memory ring of `world`, one thread each.
    pub(crate) fn on_ring<R: Send>(
        world: usize,
        f: impl Fn(usize, &mut MemLink) -> R + Sync,
    ) -> Vec<R> {
        let links = mem_ring(world);
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = links
                .into_iter()
                .enumerate()
                .map(|(r, mut link)| s.spawn(move || f(r, &mut link)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Inputs whose f64 sums depend on the fold order, so a wrong order shows in the bits.
    fn input(rank: usize, len: usize) -> Vec<f64> {
        (0..len)
            .map(|i| ((i * 7 + rank * 13) % 17) as f64 * 0.1 + 1e16 * (rank % 2) as f64)
            .collect()
    }

    /// The oracle: element `i` folded in fold order of its segment, straight from the schedule.
    fn reference(inputs: &[Vec<f64>], combine: fn(f64, f64) -> f64) -> Vec<f64> {
        let (world, len) = (inputs.len(), inputs[0].len());
        (0..len)
            .map(|i| {
                let mut order = schedule::fold_order(segment_of(i, len, world), world);
                let first = order.next().unwrap();
                order.fold(inputs[first][i], |acc, r| combine(acc, inputs[r][i]))
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn ring_path_equals_the_fold_order_oracle() {
        for world in 1..=16 {
            let base = 512 + world; // at or above the 4 KiB cut
            for len in [base, base + 1, 512, 513, 1000, 4099] {
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                let expected = bits(&reference(&inputs, fold::sum_f64));
                let results = on_ring(world, |r, link| {
                    let mut buf = inputs[r].clone();
                    let mut scratch = Scratch::default();
                    ring_allreduce(
                        link,
                        Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 },
                        &mut buf,
                        fold::sum_f64,
                        &mut scratch,
                    )
                    .unwrap();
                    bits(&buf)
                });
                for got in results {
                    assert_eq!(got, expected, "world {world} len {len}");
                }
            }
        }
    }

    /// Runs `world` ranks over `inputs` with `combine`, each rank both paths in turn, then the
    /// dispatcher (which must take `expect_gather`'s path); returns each rank's three results.
    fn three_ways(
        inputs: &[Vec<f64>],
        combine: fn(f64, f64) -> f64,
        expect_gather: Option<bool>,
    ) -> Vec<[Vec<u64>; 3]> {
        let world = inputs.len();
        on_ring(world, |r, link| {
            let mut scratch = Scratch::default();
            let call = |seq| Call { rank: r, world, op: Op::AllreduceSumF64, seq };
            let mut small = inputs[r].clone();
            small_allreduce(link, call(0), &mut small, combine, &mut scratch).unwrap();
            let mut ring = inputs[r].clone();
            ring_allreduce(link, call(1), &mut ring, combine, &mut scratch).unwrap();
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

    /// A small deterministic generator (xorshift64) for the interleaving tests.
    struct Dice(u64);

    impl Dice {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Runs one call of every rank's plan in one thread, one frame at a time, each move drawn at
    /// random among those the gates let through, over links that hold any number of frames in
    /// flight (as socket buffers do), payloads handed over in random pieces. Fails if frames
    /// remain but none may move: gates that wait in a circle.
    fn interleave<P: Plan>(plans: &mut [P], dice: &mut Dice) -> Result<(), String> {
        let world = plans.len();
        // In flight from rank r on way d: in_flight[r][d].
        let mut in_flight: Vec<[VecDeque<Vec<u8>>; 2]> =
            (0..world).map(|_| Default::default()).collect();
        let mut moved = vec![Moved::default(); world];
        let dirs = [Dir::Right, Dir::Left];
        loop {
            // (rank, way, send?) of every move the gates allow.
            let mut moves = Vec::new();
            for (r, plan) in plans.iter().enumerate() {
                let m = moved[r];
                for (d, dir) in dirs.into_iter().enumerate() {
                    let frames = plan.frames(dir);
                    if m.sent[d] < frames && plan.ready(dir, m) {
                        moves.push((r, d, true));
                    }
                    let from =
                        if dir == Dir::Right { (r + world - 1) % world } else { (r + 1) % world };
                    if m.received[d] < frames
                        && !in_flight[from][d].is_empty()
                        && plan.may_receive(dir, m)
                    {
                        moves.push((r, d, false));
                    }
                }
            }
            if moves.is_empty() {
                let done = plans.iter().zip(&moved).all(|(p, m)| {
                    m.sent == [p.frames(Dir::Right), p.frames(Dir::Left)] && m.received == m.sent
                });
                return if done { Ok(()) } else { Err(format!("stuck at {moved:?}")) };
            }
            let (r, d, send) = moves[dice.below(moves.len())];
            let dir = dirs[d];
            if send {
                let i = moved[r].sent[d];
                let plan = &plans[r];
                let frame = [&plan.header(dir, i).encode()[..], plan.payload(dir, i)].concat();
                in_flight[r][d].push_back(frame);
                moved[r].sent[d] += 1;
                continue;
            }
            let from = if dir == Dir::Right { (r + world - 1) % world } else { (r + 1) % world };
            let frame = in_flight[from][d].pop_front().expect("a frame in flight");
            let j = moved[r].received[d];
            let plan = &mut plans[r];
            let head = Header::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
            head.expect(&plan.expect(dir, j), from).map_err(|e| format!("rank {r}: {e}"))?;
            let mut rest = &frame[HEADER_LEN..];
            while !rest.is_empty() {
                let space = plan.space(dir, j);
                let n = space.len().min(rest.len()).min(1 + dice.below(20));
                space[..n].copy_from_slice(&rest[..n]);
                plan.commit(dir, j, n);
                rest = &rest[n..];
            }
            assert!(plan.space(dir, j).is_empty(), "rank {r}: payload shorter than its frame");
            moved[r].received[d] += 1;
        }
    }

    /// The ring plan under every order of moves its gates allow (sampled at random, any number
    /// of frames in flight), for worlds 1..=16, 1..=3 slices per segment and several lengths:
    /// every rank ends with the oracle's bits, and no order gets stuck. A gate one frame too
    /// loose lets a frame forward what has not come in, or overwrite what is not yet out, and
    /// some order then shows it in the bits; one that waits in a circle gets stuck.
    #[test]
    fn ring_plan_gives_the_oracle_bits_in_any_order_its_gates_allow() {
        let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
        for world in 1..=16 {
            for count in 1..=3 {
                for len in [world * count, 2 * world * count + 1, 5 * world * count + 3] {
                    let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
                    let expected = bits(&reference(&inputs, fold::sum_f64));
                    for _ in 0..6 {
                        let mut bufs = inputs.clone();
                        let mut scratches = vec![vec![0u8; 20]; world];
                        let mut plans: Vec<_> = bufs
                            .iter_mut()
                            .zip(&mut scratches)
                            .enumerate()
                            .map(|(rank, (buf, scratch))| RingPlan {
                                call: Call { rank, world, op: Op::AllreduceSumF64, seq: 0 },
                                buf: &mut buf[..],
                                combine: fold::sum_f64,
                                count,
                                scratch: &mut scratch[..],
                                filling: [Filling::NONE; 2],
                            })
                            .collect();
                        let case = format!("world {world} count {count} len {len}");
                        interleave(&mut plans, &mut dice).unwrap_or_else(|e| panic!("{case}: {e}"));
                        drop(plans);
                        for (r, buf) in bufs.iter().enumerate() {
                            assert!(bits(buf) == expected, "{case}: rank {r}");
                        }
                    }
                }
            }
        }
    }

    /// The ring plan's gates, structurally, for worlds 2..=16, 1..=3 slices and every rank: of a
    /// frame coming in and a frame going out with the same slice, one always comes before the
    /// other, whatever order the link moves them in. So no frame overwrites a slice that a frame
    /// still on its way out is reading. An honest neighbour cannot send a frame before the gate
    /// that holds it would open (what it carries went through this rank first), so the
    /// interleaving test above cannot see a receive gate that is too loose; this one does.
    #[test]
    #[allow(clippy::needless_range_loop)] // events index several tables at once
    fn ring_plan_never_takes_in_a_slice_while_a_frame_out_may_still_be_reading_it() {
        let dirs = [Dir::Right, Dir::Left];
        for world in 2..=16 {
            for count in 1..=3 {
                let mut buf = vec![0.0f64; world * count * 2];
                let mut scratch = vec![0u8; 64];
                for rank in 0..world {
                    let plan = RingPlan {
                        call: Call { rank, world, op: Op::AllreduceSumF64, seq: 0 },
                        buf: &mut buf,
                        combine: fold::sum_f64,
                        count,
                        scratch: &mut scratch,
                        filling: [Filling::NONE; 2],
                    };
                    let case = format!("world {world} count {count} rank {rank}");
                    let frames = [plan.frames(Dir::Right), plan.frames(Dir::Left)];
                    // Four chains of events: out rightward, out leftward, in rightward, in
                    // leftward. An event is (chain, index); `clock[event][c]` counts the events
                    // of chain `c` that come before it in every order the gates allow.
                    let len = |c: usize| frames[c % 2];
                    let gate = |c: usize, i: usize, before: [usize; 4]| {
                        let mut moved = Moved {
                            sent: [before[0], before[1]],
                            received: [before[2], before[3]],
                        };
                        if c < 2 {
                            moved.sent[c] = i;
                            plan.ready(dirs[c], moved)
                        } else {
                            moved.received[c - 2] = i;
                            plan.may_receive(dirs[c - 2], moved)
                        }
                    };
                    // What each gate needs directly: per other chain, the fewest events that
                    // open it with every other chain as far on as it goes.
                    let all = [frames[0], frames[1], frames[0], frames[1]];
                    let mut clock: Vec<Vec<[usize; 4]>> = (0..4)
                        .map(|c| {
                            (0..len(c))
                                .map(|i| {
                                    let mut need = [0; 4];
                                    need[c] = i;
                                    for o in (0..4).filter(|&o| o != c) {
                                        let opens = |k: usize| {
                                            let mut before = all;
                                            before[o] = k;
                                            gate(c, i, before)
                                        };
                                        need[o] = (0..=all[o]).find(|&k| opens(k)).unwrap();
                                    }
                                    need
                                })
                                .collect()
                        })
                        .collect();
                    // What comes before an event's predecessors comes before it.
                    loop {
                        let mut changed = false;
                        for c in 0..4 {
                            for i in 0..len(c) {
                                let mut need = clock[c][i];
                                for o in 0..4 {
                                    if need[o] > 0 {
                                        let prior = clock[o][need[o] - 1];
                                        for x in 0..4 {
                                            need[x] = need[x].max(prior[x]);
                                        }
                                    }
                                }
                                if raise(&mut clock[c][i], need) {
                                    changed = true;
                                }
                            }
                        }
                        if !changed {
                            break;
                        }
                    }
                    for c in 0..4 {
                        for i in 0..len(c) {
                            assert!(
                                clock[c][i][c] <= i,
                                "{case}: chain {c} event {i} waits on itself"
                            );
                        }
                    }
                    let slice_of = |c: usize, i: usize| {
                        let f = plan.frame(dirs[c % 2], i);
                        (if c < 2 { f.send } else { f.recv }, f.slice)
                    };
                    for d in 2..4 {
                        for j in 0..len(d) {
                            for e in 0..2 {
                                for i in 0..len(e) {
                                    let ordered = clock[d][j][e] > i || clock[e][i][d] > j;
                                    assert!(
                                        slice_of(e, i) != slice_of(d, j) || ordered,
                                        "{case}: frame {j} in on way {} may overwrite what frame \
                                         {i} out on way {e} is still sending",
                                        d - 2
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Raises `clock` to `need`; whether it changed.
    fn raise(clock: &mut [usize; 4], need: [usize; 4]) -> bool {
        let changed = *clock != need;
        *clock = need;
        changed
    }

    /// The ring path's frames: with segments of one slice each rank sends `world - 1 +
    /// floor(world / 2)` frames rightward and `floor((world - 1) / 2)` leftward, so the call
    /// crosses `world - 1 + floor(world / 2)` hops, not `2(world - 1)`; sliced segments make the
    /// `2(world - 1)` rightward steps per slice.
    #[test]
    fn the_ring_path_gathers_one_slice_segments_both_ways() {
        let per_slice = schedule::SLICE_BYTES / 8;
        for world in 1..=9 {
            for (len, count) in [(3 * world + 1, 1), (2 * world * per_slice, 2)] {
                assert_eq!(schedule::slices(len, world, 8), count, "world {world}");
                let sent = on_ring(world, |r, link| {
                    let mut buf = input(r, len);
                    let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
                    ring_allreduce(link, call, &mut buf, fold::sum_f64, &mut Scratch::default())
                        .unwrap();
                    link.sent
                });
                let expected = match count {
                    1 => [world - 1 + world / 2, (world - 1) / 2],
                    _ => [2 * (world - 1) * count, 0],
                };
                assert!(sent.iter().all(|&s| s == expected), "world {world}: {sent:?}");
            }
        }
    }

    /// Segments of several slices: slice by slice round the ring, the fold order holds.
    #[test]
    fn sliced_segments_equal_the_fold_order_oracle() {
        let per_slice = schedule::SLICE_BYTES / 8;
        for (world, count) in [(1, 2), (2, 3), (3, 2), (4, 3), (7, 2), (16, 2)] {
            // Segments one element longer than count - 1 slices: `count` slices each.
            let len = world * ((count - 1) * per_slice + 1) - (world > 2) as usize;
            assert_eq!(schedule::slices(len, world, 8), count, "world {world}");
            let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(r, len)).collect();
            let expected = bits(&reference(&inputs, fold::sum_f64));
            let results = on_ring(world, |r, link| {
                let mut buf = inputs[r].clone();
                let call = Call { rank: r, world, op: Op::AllreduceSumF64, seq: 0 };
                allreduce(link, call, &mut buf, fold::sum_f64, &mut Scratch::default()).unwrap();
                bits(&buf)
            });
            for (r, got) in results.into_iter().enumerate() {
                assert!(got == expected, "world {world} len {len} rank {r}");
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
        let counts = on_ring(world, |r, link| {
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
    fn allgather_delivers_every_block_in_half_the_world_of_hops() {
        for world in 1..=16 {
            for block in [0, 1, 5, 4096] {
                let results = on_ring(world, |r, link| {
                    let mut blocks = vec![Vec::new(); world];
                    blocks[r] = (0..block).map(|i| (i * 31 + r * 7) as u8).collect();
                    let call = Call { rank: r, world, op: Op::AllgatherBytes, seq: 3 };
                    allgather(link, call, block as u64, &mut blocks).unwrap();
                    (blocks, link.sent)
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

    #[test]
    fn integer_sums_wrap_and_max_propagates_nan_over_the_ring() {
        let world = 3;
        let results = on_ring(world, |r, link| {
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
        let results = on_ring(2, |r, link| {
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
