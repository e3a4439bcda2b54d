//! The index-fold-gather allreduce: a Bruck all-to-all (the index) brings every rank's raw
//! segment `j` to segment `j`'s owner, rank `j`, in `ceil(log2 n)` rounds; the owner folds the
//! contributions as they arrive; a Bruck allgather ([`super::bruck`]) then spreads the folded
//! segments. `2 ceil(log2 n)` rounds, against the ring's `n - 1 + floor(n/2)` hops.
//!
//! # The index
//!
//! Rank `t` numbers its raw segments by how far they must travel: slot `i` is its contribution
//! to rank `t - i`, segment `t - i` (mod `n`). Round `k` is way `k`, [`route`]`(k)`: every slot
//! whose bit `k` is set goes to `t - 2^k` and the same slot comes in from `t + 2^k`, in slot
//! order ([`slot`]). After round `k` the data in slot `i` at rank `t` came from rank
//! `t + (i mod 2^(k+1))`, so after the last round slot `i` at the owner holds rank `t + i`'s
//! contribution: slot `i` is place `i` of the fold order `t, t + 1, …, t - 1`. A slot stops
//! moving after the round of its highest bit, so the slots that finish in round `k` are
//! `2^k ..= min(2^(k+1), n) - 1`: the next ones in fold order, and the first frames of their
//! round. So the owner folds as rounds arrive and never buffers a contribution: the receive gate
//! of a finishing frame waits for the finishing frames of every earlier round (which, by the
//! seam's rule, is a gate on earlier ways only), and a round's frames come in in order.
//!
//! # Why the bits are the oracle's
//!
//! Element `e` of segment `j` is folded at rank `j` alone, as `acc = combine(acc, v)` with `acc`
//! starting as rank `j`'s own value and `v` running over ranks `j + 1, …, j - 1` in that order:
//! [`super::schedule::fold_order`], the order every path folds in. Chunking (below) folds each
//! element in one chunk, the same way: it changes no bit.
//!
//! # Memory: the transit store
//!
//! Data that has moved but is not home yet waits in a store. A slot of `p` set bits moves `p`
//! times; after each move but the last its data lands in the store, alternately in its two
//! cells (`p = 2`: one cell), so that move `m` never lands where move `m - 1` is still being
//! sent from (that send is of an earlier round: the receive gate waits for it). The store holds [`cells`]`(n)`
//! slices, fewer than `2n`. A call whose store would pass [`STORE_MAX_BYTES`] is cut into
//! chunks (each segment into the same number of slices, chunk `c` being every segment's slice
//! `c`), one index per chunk, one after another, and one allgather of whole segments after the
//! last: extra memory is at most `max(STORE_MAX_BYTES, cells(n) × element)` plus the fold
//! scratch.
//!
//! # Gates and streams
//!
//! - A frame out forwards what an earlier round brought (or a raw segment, present from the
//!   start); a store cell is written only once the frame that sent its last contents is out.
//! - The allgather's round `k` uses the index's route of round `k`: the same stream. Its first
//!   frame out waits for the index's round `k` to be all out, its first frame in for the
//!   index's round `k` to be all in, so the two ways use the stream in turn. Its frames in also
//!   wait for every index frame out: they overwrite the raw segments those send. Its own block
//!   goes once every index frame is in (the fold is done).
//! - Index frames travel [`Dir::Right`] and name `(chunk, round, slot)`; allgather frames travel
//!   [`Dir::Left`] and name their segment. A rank receives each name once per call, so a frame
//!   of the wrong round, phase or chunk fails its header check.
//!
//! [`cells`]: super::log_depth::cells

use std::ops::Range;

use silvic_core::CollectiveError;

use super::bruck::{gather_arrival, gather_frames, gather_move, route};
use super::element::{Element, as_bytes, as_bytes_mut, elements};
#[cfg(test)]
use super::log_depth::cells;
use super::log_depth::{STORE_MAX_BYTES, chunks, rounds};
use super::schedule::{segment, slice};
use super::seam::{Call, FramePlan, Link, Moved, Route};
use super::shared::{FOLD_SCRATCH, Scratch};
use crate::frame::{Dir, Header, Path};

/// Slots with bit `k` set among `0..world`: the frames of index round `k`.
pub(crate) fn index_frames(world: usize, k: usize) -> usize {
    let period = 1 << (k + 1);
    (world / period) * (1 << k) + (world % period).saturating_sub(1 << k)
}

/// The slot index frame `j` of round `k` carries: the `j`-th slot with bit `k` set.
pub(crate) fn slot(k: usize, j: usize) -> usize {
    let low = (1 << k) - 1;
    ((j >> k) << (k + 1)) | (1 << k) | (j & low)
}

/// The frame of round `k` that carries slot `i` (bit `k` of `i` set).
pub(crate) fn position(k: usize, i: usize) -> usize {
    ((i >> (k + 1)) << k) | (i & ((1 << k) - 1))
}

/// How many times slot `i` has moved before round `k`.
fn moves_before(i: usize, k: usize) -> usize {
    (i & ((1 << k) - 1)).count_ones() as usize
}

/// The round of slot `i`'s move before round `k`, if it moved before.
fn previous_round(i: usize, k: usize) -> Option<usize> {
    (i & ((1 << k) - 1)).checked_ilog2().map(|b| b as usize)
}

/// The store's layout: per slot, its two cells' first byte, `usize::MAX` for a cell it does not
/// have; every cell is `cell` bytes.
#[derive(Debug)]
pub(super) struct Store {
    at: Vec<[usize; 2]>,
    cell: usize,
}

impl Store {
    pub(super) fn new(world: usize, cell: usize) -> Self {
        let mut next = 0;
        let at = (0..world)
            .map(|i| {
                let needed = (i.count_ones() as usize).saturating_sub(1).min(2);
                let mut here = [usize::MAX; 2];
                for c in here.iter_mut().take(needed) {
                    *c = next;
                    next += cell;
                }
                here
            })
            .collect();
        Store { at, cell }
    }

    pub(super) fn bytes(&self) -> usize {
        self.at.iter().flatten().filter(|a| **a != usize::MAX).count() * self.cell
    }

    /// The cell that move `q` of slot `i` lands in (move `q + 1` is sent from it): the two
    /// cells in turn.
    fn landing(&self, i: usize, q: usize) -> Range<usize> {
        let start = self.at[i][q % 2];
        start..start + self.cell
    }
}

/// Where an incoming frame of one way stands: the frame, its bytes in so far, and how many of
/// them wait in the fold scratch to be folded.
#[derive(Debug, Clone, Copy)]
struct Filling {
    frame: usize,
    bytes: usize,
    pending: usize,
}

/// What frame `i` of an index round reads (out) or writes (in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// The caller's buffer, these elements: a raw segment's slice going out, a folded slice
    /// coming in, or an allgathered segment.
    Buf(usize, usize),
    /// These bytes of the store.
    Store(usize, usize),
}

/// The index of one chunk, and the allgather after it if it is the last, as a plan.
pub(super) struct IndexPlan<'a, T, C> {
    call: Call,
    buf: &'a mut [T],
    combine: C,
    /// The chunks of the call, and the one this plan moves.
    count: usize,
    chunk: usize,
    /// The index's rounds, then (in the last chunk's plan) the allgather's.
    routes: Vec<Route>,
    store: &'a Store,
    transit: &'a mut [u8],
    fold: &'a mut [u8],
    /// Per way, the frame coming in.
    filling: Vec<Filling>,
}

impl<'a, T: Element, C: Fn(T, T) -> T> IndexPlan<'a, T, C> {
    /// The plan of chunk `chunk` of `count` (see the module doc), its transit data in
    /// `transit` laid out as `store` says, its folds through `fold` (at least one element).
    pub(super) fn new(
        call: Call,
        buf: &'a mut [T],
        combine: C,
        (count, chunk): (usize, usize),
        store: &'a Store,
        transit: &'a mut [u8],
        fold: &'a mut [u8],
    ) -> Self {
        let gathers = chunk + 1 == count;
        let rounds = rounds(call.world);
        let routes: Vec<Route> =
            (0..rounds).chain((0..rounds).filter(|_| gathers)).map(route).collect();
        let filling = vec![Filling { frame: usize::MAX, bytes: 0, pending: 0 }; routes.len()];
        IndexPlan { call, buf, combine, count, chunk, routes, store, transit, fold, filling }
    }

    fn rounds(&self) -> usize {
        rounds(self.call.world)
    }

    fn seg(&self, t: usize, minus: usize) -> usize {
        let n = self.call.world;
        (t + n - minus % n) % n
    }

    fn chunk_of(&self, seg: usize) -> Range<usize> {
        slice(self.buf.len(), self.call.world, seg, self.count, self.chunk)
    }

    /// What frame `j` of `way` reads going out (`out`) or writes coming in, and the segment its
    /// data belongs to.
    pub(super) fn place(&self, way: usize, j: usize, out: bool) -> (Place, usize) {
        let Call { rank: t, world: n, .. } = self.call;
        let rounds = self.rounds();
        if way >= rounds {
            let (send, recv) = gather_move(t, n, way - rounds, j);
            let seg = if out { send } else { recv };
            let r = segment(self.buf.len(), n, seg);
            return (Place::Buf(r.start, r.end), seg);
        }
        let (k, i) = (way, slot(way, j));
        let low = i & ((1 << k) - 1);
        // Out: the data came from t + low. In: it comes from t + 2^k, whose data came from
        // t + 2^k + low. Either way it is bound for its origin minus i.
        let (origin_ahead, m) = if out { (low, moves_before(i, k)) } else { (low + (1 << k), 0) };
        let seg = self.seg(t + origin_ahead, i);
        let r = self.chunk_of(seg);
        let bytes = r.len() * size_of::<T>();
        if out && m == 0 {
            return (Place::Buf(r.start, r.end), seg);
        }
        if !out && i >> (k + 1) == 0 {
            return (Place::Buf(r.start, r.end), seg); // home: folded into the owned slice
        }
        // Out: sent from where the move before landed. In: this move lands.
        let landed = if out { m - 1 } else { moves_before(i, k) };
        let cell = self.store.landing(i, landed);
        (Place::Store(cell.start, cell.start + bytes), seg)
    }

    fn header(&self, way: usize, j: usize, out: bool) -> Header {
        let Call { op, seq, world, .. } = self.call;
        let total = size_of_val(self.buf) as u64;
        let (place, seg) = self.place(way, j, out);
        let len = match place {
            Place::Buf(a, b) => (b - a) * size_of::<T>(),
            Place::Store(a, b) => b - a,
        } as u64;
        let head = Header::data(op, seq, total, len).on(Path::Index);
        let rounds = self.rounds();
        if way >= rounds {
            return head.carrying(Dir::Left, seg);
        }
        let name = (self.chunk * rounds + way).saturating_mul(world).saturating_add(slot(way, j));
        head.carrying(Dir::Right, name)
    }

    /// Whether every frame of the index's ways has moved, out (`out`) or in.
    fn index_done(&self, progress: Moved<'_>, out: bool) -> bool {
        let counts = if out { progress.sent } else { progress.received };
        (0..self.rounds()).all(|k| counts[k] == index_frames(self.call.world, k))
    }
}

impl<T: Element, C: Fn(T, T) -> T> FramePlan for IndexPlan<'_, T, C> {
    fn call(&self) -> Call {
        self.call
    }
    fn ways(&self) -> &[Route] {
        &self.routes
    }
    fn frames(&self, way: usize) -> usize {
        let (n, rounds) = (self.call.world, self.rounds());
        if way < rounds { index_frames(n, way) } else { gather_frames(n, way - rounds) }
    }
    fn header(&self, way: usize, i: usize) -> Header {
        self.header(way, i, true)
    }
    fn expect(&self, way: usize, j: usize) -> Header {
        self.header(way, j, false)
    }
    fn ready(&self, way: usize, progress: Moved<'_>) -> bool {
        let (rounds, j) = (self.rounds(), progress.sent[way]);
        if way >= rounds {
            let k = way - rounds;
            let shared = progress.sent[k] == index_frames(self.call.world, k);
            return shared
                && match gather_arrival(j) {
                    None => self.index_done(progress, false),
                    Some((round, frame)) => progress.received[rounds + round] > frame,
                };
        }
        let i = slot(way, j);
        match previous_round(i, way) {
            None => true,
            Some(k) => progress.received[k] > position(k, i),
        }
    }
    fn may_receive(&self, way: usize, progress: Moved<'_>) -> bool {
        let (n, rounds, j) = (self.call.world, self.rounds(), progress.received[way]);
        if way >= rounds {
            let k = way - rounds;
            return progress.received[k] == index_frames(n, k) && self.index_done(progress, true);
        }
        let i = slot(way, j);
        if i >> (way + 1) == 0 {
            // Home: fold in order, after every earlier round's slots that came home.
            return (0..way).all(|k| progress.received[k] >= gather_frames(n, k));
        }
        // Landing in the cell that the move before the previous one filled: the previous move
        // must have sent it on.
        match (moves_before(i, way), previous_round(i, way)) {
            (m, Some(k)) if m >= 2 => progress.sent[k] > position(k, i),
            _ => true,
        }
    }
    fn payload(&self, way: usize, i: usize) -> &[u8] {
        match self.place(way, i, true).0 {
            Place::Buf(a, b) => as_bytes(&self.buf[a..b]),
            Place::Store(a, b) => &self.transit[a..b],
        }
    }
    fn space(&mut self, way: usize, j: usize) -> &mut [u8] {
        if self.filling[way].frame != j {
            self.filling[way] = Filling { frame: j, bytes: 0, pending: 0 };
        }
        let f = self.filling[way];
        let folds = self.folds(way, j);
        match self.place(way, j, false).0 {
            Place::Store(a, b) => &mut self.transit[a + f.bytes..b],
            Place::Buf(a, b) if !folds => &mut as_bytes_mut(&mut self.buf[a..b])[f.bytes..],
            Place::Buf(a, b) => {
                let left = (b - a) * size_of::<T>() - f.bytes;
                let room = (self.fold.len() - f.pending).min(left);
                &mut self.fold[f.pending..f.pending + room]
            }
        }
    }
    fn folds(&self, way: usize, j: usize) -> bool {
        way < self.rounds() && slot(way, j) >> (way + 1) == 0
    }

    fn commit(&mut self, way: usize, j: usize, n: usize) {
        let folds = self.folds(way, j);
        let (place, _) = self.place(way, j, false);
        let f = &mut self.filling[way];
        let (Place::Buf(a, _), true) = (place, folds) else {
            f.bytes += n;
            return;
        };
        // acc = combine(acc, v): the owner's slice is the accumulator, the arriving
        // contribution the next rank of the fold order.
        let width = size_of::<T>();
        let done = (f.bytes - f.pending) / width;
        f.bytes += n;
        f.pending += n;
        let whole = f.pending / width;
        let pending = f.pending;
        f.pending -= whole * width;
        let acc = &mut self.buf[a + done..a + done + whole];
        for (d, v) in acc.iter_mut().zip(elements::<T>(&self.fold[..whole * width])) {
            *d = (self.combine)(*d, v);
        }
        self.fold.copy_within(whole * width..pending, 0);
    }
}

/// The index-fold-gather path with the store capped at `cap` bytes (see the module doc).
pub(super) fn index_allreduce_capped<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
    cap: usize,
) -> Result<(), CollectiveError> {
    let (n, width) = (call.world, size_of::<T>());
    let count = chunks(buf.len(), n, width, cap);
    let store = Store::new(n, buf.len().div_ceil(n).div_ceil(count) * width);
    // Every cell is written before it is read, so what the scratch held does not matter.
    scratch.gathered.resize(store.bytes(), 0);
    scratch.fold.resize(FOLD_SCRATCH, 0);
    for chunk in 0..count {
        let (transit, fold) = (&mut scratch.gathered[..], &mut scratch.fold[..]);
        let mut plan = IndexPlan::new(call, buf, combine, (count, chunk), &store, transit, fold);
        link.run(&mut plan)?;
    }
    Ok(())
}

/// The index-fold-gather allreduce: `buf` replaced by its reduction, folded in fold order.
pub(crate) fn index_allreduce<T: Element, C: Fn(T, T) -> T + Copy>(
    link: &mut dyn Link,
    call: Call,
    buf: &mut [T],
    combine: C,
    scratch: &mut Scratch,
) -> Result<(), CollectiveError> {
    index_allreduce_capped(link, call, buf, combine, scratch, STORE_MAX_BYTES)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
