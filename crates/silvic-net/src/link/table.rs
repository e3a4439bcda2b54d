//! Which streams a call's plan uses ([`Table`]): per stream, the ways that write it and the ways
//! that read it; and where a call stands between turns ([`Waits`]).
//!
//! Invariants: a way writes the stream to the rank its route sends to and reads the stream
//! from the rank that far back; ways that share a stream take it in turn, the earlier way's
//! frames all before the later one's, so frames of two ways never interleave on a stream. A
//! call waits on a stream only while the plan lets that stream's next frame through (in or
//! out).

use super::stream::Stream;
use super::way::Ways;
use crate::ring::seam::{Call, FramePlan, Route};

/// Where a call stands between turns, as bits of streams.
///
/// It waits on the streams where the plan lets the next frame in and it has not come, or lets a
/// frame out and the socket has not taken it all. A stream the call still needs but whose next
/// frame in and out the plan holds back is not waited on: its turn waits on another stream, and
/// its peer may have sent all it can and be waiting itself, its notices queued behind a data
/// frame this rank does not read yet, so its silence says nothing of it. Where no stream is
/// waited on so (the seam's rule keeps some frame free to move, so this is a safeguard), it
/// waits on every stream the call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waits {
    /// The streams the call waits on (above).
    pub(super) on: u64,
    /// The streams where the plan lets the next frame in.
    pub(super) reads: u64,
    /// The streams with a frame partly written or free to start. Nothing but a turn's own
    /// reads and writes changes what the plan lets go, so the next turn writes only these (and
    /// streams with notices queued).
    pub(super) writes: u64,
}

/// The plan's ways on the streams: per stream, the ways that write it and the ways that read
/// it, in the plan's order. Way `w` writes the stream to rank `rank + offset` and reads the one
/// from rank `rank - offset`, found by peer rank; in a world of two, whose two streams both go
/// to rank 1, by the sign of the offset too (a positive one writes the stream dialled to the
/// right and reads the one accepted from the left, as the ring always has).
///
/// Several ways may share a stream: the plans use it in turn (every frame of an earlier way on
/// it before any of a later one's), so the way on a stream now is the earliest one not yet done
/// with it, and the next frame read from it is that way's (its header is checked against that
/// way's [`FramePlan::expect`], so a frame that does not fit is refused as ever).
///
/// The table is kept between calls and built again only when a call's ways differ from the
/// last call's: a trainer's calls mostly repeat one plan's routes.
#[derive(Debug, Default)]
pub(super) struct Table {
    writers: Vec<Vec<usize>>,
    readers: Vec<Vec<usize>>,
    /// What the table was built for: the rank, the world, and the plan's routes, way by way.
    built_for: Option<(usize, usize)>,
    routes: Vec<Route>,
}

impl Table {
    /// The table of `plan` over `streams` (the same streams every call). Panics if a way's
    /// route has no stream: a plan this link cannot carry is a bug, not a peer's doing.
    pub(super) fn build(&mut self, plan: &dyn FramePlan, streams: &[Stream]) {
        let Call { rank, world, .. } = plan.call();
        if self.built_for == Some((rank, world)) && self.routes == plan.ways() {
            return;
        }
        self.built_for = Some((rank, world));
        self.routes.clear();
        self.routes.extend_from_slice(plan.ways());
        let find = |offset: isize| {
            let peer = Route { offset }.sends_to(rank, world);
            let to_peer = |s: &&Stream| s.peer == peer;
            let same_side = |s: &&Stream| s.route.offset.signum() == offset.signum();
            let found = match streams.iter().filter(to_peer).count() {
                1 => streams.iter().position(|s| to_peer(&s)),
                _ => streams.iter().position(|s| to_peer(&s) && same_side(&s)),
            };
            found.unwrap_or_else(|| unreachable!("no stream to rank {peer} for offset {offset}"))
        };
        for lists in [&mut self.writers, &mut self.readers] {
            lists.iter_mut().for_each(Vec::clear);
            lists.resize_with(streams.len(), Vec::new);
        }
        for (w, route) in plan.ways().iter().enumerate() {
            self.writers[find(route.offset)].push(w);
            self.readers[find(-route.offset)].push(w);
        }
    }

    /// Whether no way of the plan writes or reads stream `s`.
    pub(super) fn idle(&self, s: usize) -> bool {
        self.writers[s].is_empty() && self.readers[s].is_empty()
    }

    /// The way that writes stream `s` now: the first whose frames are not all out, else the
    /// last (done), if any way writes it.
    pub(super) fn writer(&self, s: usize, ways: &Ways) -> Option<usize> {
        let on = &self.writers[s];
        on.iter().copied().find(|&w| !ways.out_done(w)).or(on.last().copied())
    }

    /// The way that reads stream `s` now: the first whose frames are not all in, else the last.
    pub(super) fn reader(&self, s: usize, ways: &Ways) -> Option<usize> {
        let on = &self.readers[s];
        on.iter().copied().find(|&w| !ways.in_done(w)).or(on.last().copied())
    }
}
